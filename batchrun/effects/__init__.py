"""What a job's ``process`` can do beside its own database: the effects a run lends its
contexts, each through the run's pacer (batchrun/policy/pacing.py).

sending.py    ctx.send_email (render, build, fence, pace, send), the suppression list
backends.py   the jobs' named backends (ctx.backend): one gate each, --rate's cap
http.py       ctx.http: an httpx client whose requests go through a backend's gate
lender.py     Effects.context: a context and its effects for a run or a consumer
"""

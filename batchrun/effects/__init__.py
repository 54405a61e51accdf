"""What a job's ``process`` can do beside its own database: the effects a run lends its
contexts, each through the run's pacer (batchrun/policy/pacing.py).

sending.py    ctx.send_email (render, build, fence, pace, send), the suppression list
"""

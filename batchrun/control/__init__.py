"""Seeing and steering jobs: what ran, one entity's story, pause/resume/cancel, alerts and
metrics. The CLI, the Lambda and the dashboard read and write these.

history.py    batchrun_run: one row per run, drain, worker, Lambda invocation, events drain
runrecord.py  a process's own row for its whole life (heartbeat, end, webhook)
steering.py   batchrun_control: pause, resume, cancel, seen at every heartbeat
story.py      ``batchrun why``: one entity's story in time order
timeline.py   its steps (Event) and their times
notify.py     BATCHRUN_NOTIFY_URL: the webhook a run's end tells
metrics.py    Prometheus text (``batchrun metrics``, the dashboard's /metrics)
"""

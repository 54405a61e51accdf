"""The runtime: everything a job does not say. It knows no job.

runtime.py   Runtime: runs jobs and consumes the queue over one set of backends
run.py       one run: pages -> claims -> prepare -> process, dry run, hand-off
pager.py     the job's keyset pages, claimed; then what other runs held
work.py      one entity: fence, process, classify, record
lease.py     claims, their heartbeat and the fence (claims that are lost stop the work)
recorder.py  group commit of outcomes; one retry message per entity
outcomes.py  what an exception from process means (retry, fail, skip)
sending.py   ctx.send_email: templates, pacing, throttling; ctx.paced() (policy/pacing.py)
consume.py   retry, task, continuation and shard messages, and their verdicts
fanout.py    a period's entities as shards on a queue
reports.py   the JSON summaries
"""

from __future__ import annotations

from batchrun.runtime.consume import Verdict
from batchrun.runtime.reports import FanOut, RetrySummary, Summary
from batchrun.runtime.run import Options
from batchrun.runtime.runtime import Runtime

__all__ = ["FanOut", "Options", "RetrySummary", "Runtime", "Summary", "Verdict"]

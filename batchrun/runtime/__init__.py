"""The runtime: the wiring. It knows no job.

runtime.py     Runtime: one set of connections, the jobs, and the roads they travel
               (batchrun/pipeline/) for a run, a drain, a worker and the Lambda
resources.py   open the database, mailer and queue a command needs, from settings
preflight.py   the checks before any effect (tables, queue, mailer, templates)
inspection.py  looking without touching: status, preview, db explain's page plans
"""

from __future__ import annotations

from batchrun.pipeline.apply import Disposition
from batchrun.pipeline.reports import FanOut, RetrySummary, Summary
from batchrun.pipeline.run import Options, new_summary
from batchrun.runtime.runtime import Runtime

__all__ = [
    "Disposition",
    "FanOut",
    "Options",
    "RetrySummary",
    "Runtime",
    "Summary",
    "new_summary",
]

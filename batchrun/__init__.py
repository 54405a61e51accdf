"""batchrun: per-entity batch jobs against your own database, exactly once.

The public API, everything a job needs (the built-in birthday job imports nothing else):

    Job, Context        the contract a job is written against (batchrun.job)
    Skip, Retry, Fail   what ``process`` raises to end one entity other than by success
    RetryPolicy         a job's attempts, backoff and longest delay (``Job.retry``)
    Period              the year, month or day a run is for (batchrun.period)
    SqlFolder           a job's named queries and schema steps, one folder per dialect
    valid_address       the plain syntax check batchrun applies to every recipient
    gift_codes          fresh 80-bit codes (Crockford base32) and their display form
"""

from __future__ import annotations

from batchrun import codes as gift_codes
from batchrun.db.sql import SqlFolder
from batchrun.job import Context, Fail, Job, Retry, Skip
from batchrun.mail.base import valid_address
from batchrun.period import Period
from batchrun.policy.retry import RetryPolicy

__version__ = "0.2.0"

__all__ = [
    "Context",
    "Fail",
    "Job",
    "Period",
    "Retry",
    "RetryPolicy",
    "Skip",
    "SqlFolder",
    "__version__",
    "gift_codes",
    "valid_address",
]

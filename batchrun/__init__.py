"""batchrun: per-entity batch jobs against your own database, exactly once.

The public API, everything a job needs (the built-in birthday job imports nothing else):

    Job, Context        the contract a job is written against (batchrun.job)
    Task                a job of submitted tasks, one entity's at a time (batchrun.tasks)
    Backend             an outside service a job calls: concurrency, rate, ready probe
                        (``Job.backends``; ``ctx.backend(name)``, ``ctx.http(name)``)
    connect             a client that submits tasks from an application (batchrun.client)
    Skip, Retry, Fail   what ``process`` raises to end one entity other than by success
    Busy                a backend is busy: a ``Retry`` that is never an attempt
    RetryPolicy         a job's attempts, backoff and longest delay (``Job.retry``)
    Period              the year, month or day a run is for (batchrun.period)
    SqlFolder           a job's named queries and schema steps, one folder per dialect
    valid_address       the plain syntax check batchrun applies to every recipient
"""

from __future__ import annotations

from batchrun.backend import Backend
from batchrun.db.sql import SqlFolder
from batchrun.job import Busy, Context, Fail, Job, Retry, Skip
from batchrun.mail.base import valid_address
from batchrun.period import Period
from batchrun.policy.retry import RetryPolicy
from batchrun.tasks import Task, TaskItem

__version__ = "0.2.0"

__all__ = [
    "Backend",
    "Busy",
    "Context",
    "Fail",
    "Job",
    "Period",
    "Retry",
    "RetryPolicy",
    "Skip",
    "SqlFolder",
    "Task",
    "TaskItem",
    "__version__",
    "connect",
    "valid_address",
]


def __getattr__(name: str) -> object:
    if name == "connect":  # imported when used: the client pulls in the database drivers
        from batchrun.client import connect

        return connect
    if name == "gift_codes":  # the birthday job's own now; kept for jobs that used it
        from batchrun.jobs.birthday import codes

        return codes
    raise AttributeError(f"module 'batchrun' has no attribute {name!r}")

"""The dashboard's view of the run history and its steering (pause, resume, cancel).

The run history (``batchrun_run``) and the pause/cancel flags are steer-core's; this module
is the one place the dashboard reads and calls them.
"""

from __future__ import annotations

from typing import Any

from batchrun.errors import UsageError
from batchrun.job import Job
from batchrun.period import Period
from batchrun.runtime.runtime import Runtime
from batchrun.runtime.story import RunFinder

ACTIONS = ("pause", "resume", "cancel")


async def runs_now(rt: Runtime, job: Job) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The job's last finished run and the runs going on now."""
    return None, []


async def runs_of(rt: Runtime, job: Job, limit: int = 50) -> list[dict[str, Any]]:
    """The job's runs, newest first."""
    return []


async def run(rt: Runtime, run_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """One run's row and the problems of its period, or None."""
    return None


async def paused(rt: Runtime, job: Job, period: str) -> bool:
    """Whether the job's period is paused."""
    return False


def run_finder(rt: Runtime) -> RunFinder | None:
    """The run history's look-up of the run going on at a moment, if there is a history."""
    return None


async def steer(rt: Runtime, job: Job, period: Period, action: str, reason: str | None) -> str:
    """Pause, resume or cancel the job's period; the line to show."""
    if action not in ACTIONS:
        raise UsageError(f"unknown action {action!r}")
    raise UsageError(f"{action} is not available in this build")

"""The dashboard's view of the run history and its steering: the one place it reads
``batchrun_run`` (control/history.py) and pauses, resumes or cancels
(control/steering.py)."""

from __future__ import annotations

from typing import Any

from batchrun.control.history import SERVING, History, RunRow, iso
from batchrun.control.steering import EVERY_PERIOD, Controls
from batchrun.control.story import STATE_NAMES
from batchrun.errors import UsageError
from batchrun.job import Job
from batchrun.period import Period
from batchrun.runtime.runtime import Runtime
from batchrun.task import is_task
from batchrun.urls import mask_text

ACTIONS = ("pause", "resume", "cancel")
SHOWN_RUNS = 50
SHOWN_PROBLEMS = 200


def _history(rt: Runtime) -> History:
    return History(rt.store.db, lease_s=rt.settings.lease_s)


def masked(rt: Runtime, text: str | None) -> str:
    """``text`` with the passwords of the runtime's URLs masked."""
    settings = rt.settings
    return mask_text(text or "", settings.db_url, settings.mail_url, settings.retry_queue_url)


def row_view(rt: Runtime, run: RunRow) -> dict[str, Any]:
    """A run row as the pages show it."""
    return {
        "id": run.id,
        "job": run.job or "(every job)",
        "period": run.period or "",
        "kind": run.kind,
        "host": run.host,
        "pid": run.pid,
        "outcome": run.outcome,
        "started": (iso(run.started_at) or "").replace("T", " ")[:19],
        "when": (iso(run.ended_at or run.heartbeat_at) or "").replace("T", " ")[:19],
        "took": f"{run.duration_s:.1f} s",
        "counts": run.counts or {},
        "error": masked(rt, run.error),
    }


async def runs_now(rt: Runtime, job: Job) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The job's last run that is over, and its runs going on now (for a task job, the
    workers and Lambda invocations that serve every job)."""
    history = _history(rt)
    if is_task(job):
        last = await history.last_serving(job.name)
    else:
        last = (await history.last_per_job()).get(job.name)
    running = [row_view(rt, r) for r in await history.running() if _of(r, job)]
    return (row_view(rt, last) if last is not None else None), running


async def runs_of(rt: Runtime, job: Job, limit: int = SHOWN_RUNS) -> list[dict[str, Any]]:
    """The job's runs, newest first (for a task job, also those serving every job)."""
    if is_task(job):
        return [row_view(rt, r) for r in await _serving(rt, job, limit)]
    return [row_view(rt, r) for r in await _history(rt).runs(job.name, limit=limit)]


async def _serving(rt: Runtime, job: Job, limit: int) -> list[RunRow]:
    """The newest runs that can have run ``job``'s tasks: its own, and those serving
    every job."""
    return await _history(rt).runs_serving(job.name, limit=limit)


def _of(run: RunRow, job: Job) -> bool:
    """Whether ``run`` is ``job``'s; a task job's tasks are run by processes serving
    every job too (a worker, a Lambda invocation)."""
    return run.job == job.name or (is_task(job) and run.job is None and run.kind in SERVING)


async def run(rt: Runtime, run_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """One run's row and the entities of its period not done (with their reasons)."""
    found = await _history(rt).get(run_id)
    if found is None:
        return None
    view = row_view(rt, found)
    view["fields"] = [
        ("kind", found.kind),
        ("host", found.host),
        ("pid", found.pid),
        ("version", found.version),
        ("started", iso(found.started_at)),
        ("last heartbeat", iso(found.heartbeat_at)),
        ("ended", iso(found.ended_at) or ""),
        ("took", view["took"]),
        ("exit code", "" if found.exit_code is None else found.exit_code),
        ("error", view["error"]),
    ]
    problems: list[dict[str, Any]] = []
    if found.job is not None and found.period is not None:
        counts = await rt.store.status(job=found.job, period=found.period, problems=SHOWN_PROBLEMS)
        problems = [
            {
                "id": uid,
                "state": STATE_NAMES.get(state, str(state)),
                "attempts": attempts,
                "reason": reason or "",
            }
            for uid, state, attempts, reason in counts.problems
        ]
    return view, problems


async def paused(rt: Runtime, job: Job, period: str) -> bool:
    """Whether the job's period (or every period of the job) is paused; a task job only
    as a whole (a period's row, which its tasks never read, does not count)."""
    periods = (EVERY_PERIOD,) if is_task(job) else (EVERY_PERIOD, period)
    for row in await Controls(rt.store.db).rows():
        if row.job == job.name and row.paused and row.period in periods:
            return True
    return False


async def steer(
    rt: Runtime, job: Job, period: Period | None, action: str, reason: str | None
) -> str:
    """Pause, resume or cancel the job's period (None: every period of the job); the key
    of the notice the page shows (``notices.NOTICES``)."""
    controls = Controls(rt.store.db)
    which = None if period is None else str(period)
    if action == "pause":
        await controls.pause(job.name, which, reason or "from the dashboard")
        return "paused"
    if action == "resume":
        return "resumed" if await controls.resume(job.name, which) else "not-paused"
    if action == "cancel":
        await controls.cancel(job.name, which)
        return "cancelled"
    raise UsageError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")

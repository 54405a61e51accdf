"""What the dashboard's pages show, read from the store and the queue (reads only, except
``redrive``: queue/dead.py's). The pages' templates get plain dicts and lists from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchrun.control.story import STATE_NAMES
from batchrun.control.timeline import iso
from batchrun.effects.lender import NoEffects
from batchrun.errors import QueueError
from batchrun.job import Context, Job
from batchrun.period import Period, current, parse
from batchrun.queue import dead
from batchrun.queue.dead import DeadLetter
from batchrun.queue.local import LocalQueue
from batchrun.runtime.runtime import Runtime
from batchrun.task import is_task
from batchrun.tasks.store import TaskStore

DONE = ("sent", "skipped", "failed")
SHOWN_MESSAGES = 200
TASKS = "tasks"  # a task job's one row, in place of a period


@dataclass(slots=True)
class PeriodCounts:
    """One period of a job: its ledger counts, and how far along it is."""

    period: str
    counts: dict[str, int] = field(default_factory=dict)
    todo: int | None = None  # entities the job says are still to do (Job.status "pending")

    @property
    def done(self) -> int:
        return sum(self.counts.get(s, 0) for s in DONE)

    @property
    def total(self) -> int:
        if self.todo is not None:
            return self.done + self.todo
        return sum(self.counts.values())

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "counts": self.counts,
            "done": self.done,
            "total": self.total,
            "percent": round(self.percent, 1),
        }


async def periods(rt: Runtime, job: Job) -> list[PeriodCounts]:
    """The job's periods that have ledger rows, newest first, with their counts; a task
    job's tasks as one row (``tasks``: a task job has no periods)."""
    if is_task(job):
        return [await tasks(rt, job)]
    found: dict[str, PeriodCounts] = {}
    for period, state, count in await rt.store.db.fetchall("ui_job_periods", job=job.name):
        entry = found.setdefault(str(period), PeriodCounts(str(period)))
        entry.counts[STATE_NAMES.get(int(state), str(state))] = int(count)
    return sorted(found.values(), key=lambda p: p.period, reverse=True)


async def progress(rt: Runtime, job: Job, period: str | None = None) -> PeriodCounts:
    """How far ``period`` (default: the newest with ledger rows, else the current one) is;
    for a task job, its tasks (whatever the period)."""
    if is_task(job):
        return await tasks(rt, job)
    known = await periods(rt, job)
    chosen = period or (known[0].period if known else str(current(job.period)))
    entry = next((p for p in known if p.period == chosen), PeriodCounts(chosen))
    ctx = Context(job, parse(job.period, chosen), rt.store.jobdb, NoEffects(rt.store))
    extra = await job.status(ctx)
    if "pending" in extra:
        entry.todo = int(extra["pending"])
    return entry


async def tasks(rt: Runtime, job: Job) -> PeriodCounts:
    """A task job's tasks by state, under the ledger's names the pages show: pending
    (running too), sent (succeeded), retrying (failed, waiting for another attempt),
    failed (dead). Labelled ``tasks``: a task job has no periods."""
    counts = await TaskStore(rt.store.db).counts(job.name)
    shown = {
        "pending": counts["pending"] + counts["running"] + counts["claimed_by_stopped_run"],
        "sent": counts["succeeded"],
        "retrying": counts["failed"],
        "failed": counts["dead"],
    }
    return PeriodCounts(TASKS, {k: v for k, v in shown.items() if v})


def period_of(job: Job, text: str | None) -> Period:
    """The period a page names (``?period=``), default the current one; ValueError if bad.
    A task job's is always the current one, which its context carries."""
    if is_task(job):
        return current(job.period)
    return current(job.period) if not text else parse(job.period, text)


async def waiting(rt: Runtime) -> list[dict[str, Any]] | None:
    """The local queue's messages waiting for a retry (or in flight), oldest first; None for
    an SQS queue, whose messages cannot be listed without receiving them."""
    if not isinstance(rt.queue, LocalQueue):
        return None
    rows = await rt.store.db.fetchall("ui_queue_waiting", limit=SHOWN_MESSAGES)
    out = []
    for message_id, body, visible_at, receives, created in rows:
        letter = DeadLetter(str(message_id), str(body), "", int(receives), int(created))
        out.append({**_named(letter), "visible": iso(int(visible_at))})
    return out


async def dead_letters(rt: Runtime) -> tuple[list[dict[str, Any]] | None, str]:
    """The dead letters (local queue or the SQS dead-letter queue), or None and why not."""
    if rt.queue is None:
        return None, "no queue"
    try:
        letters = await dead.list_dead(rt.queue, limit=SHOWN_MESSAGES)
    except QueueError as exc:
        return None, str(exc)
    return [_named(letter) for letter in letters], ""


def _named(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "kind": letter.kind or "?",
        "job": letter.job or "?",
        "period": letter.period or "",
        "entity_id": letter.entity_id,
        "reason": letter.reason or str(letter.fields.get("reason") or ""),
        "receives": letter.receive_count,
        "created": iso(letter.sent_at_ms) if letter.sent_at_ms is not None else "",
    }


async def redrive(rt: Runtime, ids: list[str]) -> int:
    """Put the dead letters ``ids`` back on the queue (their ledger rows revived first);
    how many moved."""
    if not ids or rt.queue is None:
        return 0
    return len(await dead.redrive(rt.queue, rt.store, ids=ids))

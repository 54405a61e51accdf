"""What the dashboard's pages show, read from the store and the queue (reads only, except
``redrive``). The pages' templates get plain dicts and lists from here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from batchrun.db.base import now_ms
from batchrun.job import Context, Job
from batchrun.period import Period, current, parse
from batchrun.queue.local import LocalQueue
from batchrun.runtime.inspect import NoEffects
from batchrun.runtime.runtime import Runtime
from batchrun.runtime.story import STATE_NAMES, iso

DONE = ("sent", "skipped", "failed")
SHOWN_MESSAGES = 200


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
    """The job's periods that have ledger rows, newest first, with their counts."""
    found: dict[str, PeriodCounts] = {}
    for period, state, count in await rt.store.db.fetchall("ui_job_periods", job=job.name):
        entry = found.setdefault(str(period), PeriodCounts(str(period)))
        entry.counts[STATE_NAMES.get(int(state), str(state))] = int(count)
    return sorted(found.values(), key=lambda p: p.period, reverse=True)


async def progress(rt: Runtime, job: Job, period: str | None = None) -> PeriodCounts:
    """How far ``period`` (default: the newest with ledger rows, else the current one) is."""
    known = await periods(rt, job)
    chosen = period or (known[0].period if known else str(current(job.period)))
    entry = next((p for p in known if p.period == chosen), PeriodCounts(chosen))
    ctx = Context(job, parse(job.period, chosen), rt.store.jobdb, NoEffects(rt.store))
    extra = await job.status(ctx)
    if "pending" in extra:
        entry.todo = int(extra["pending"])
    return entry


def period_of(job: Job, text: str | None) -> Period:
    """The period a page names (``?period=``), default the current one; ValueError if bad."""
    return current(job.period) if not text else parse(job.period, text)


async def queue_messages(rt: Runtime, *, dead: bool) -> list[dict[str, Any]] | None:
    """The local queue's waiting (or dead) messages, oldest first; None for an SQS queue,
    whose messages cannot be listed without receiving them."""
    if not isinstance(rt.queue, LocalQueue):
        return None
    rows = await rt.store.db.fetchall("ui_queue_messages", dead=int(dead), limit=SHOWN_MESSAGES)
    out = []
    for message_id, body, visible_at, receives, _, dead_reason, created in rows:
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            data = {}
        entity = data.get("id", data.get("user_id"))
        out.append(
            {
                "id": int(message_id),
                "kind": str(data.get("kind", "?")),
                "job": str(data.get("job", "?")),
                "period": str(data.get("period", data.get("month", ""))),
                "entity_id": entity if isinstance(entity, int) else None,
                "reason": str(dead_reason or data.get("reason") or ""),
                "receives": int(receives),
                "created": iso(int(created)),
                "visible": iso(int(visible_at)),
            }
        )
    return out


async def redrive(rt: Runtime, ids: list[int]) -> int:
    """Put the local queue's dead letters ``ids`` back on the queue; how many moved."""
    if not ids or not isinstance(rt.queue, LocalQueue):
        return 0
    return await rt.store.db.execute("ui_redrive", ids=ids, now=now_ms())

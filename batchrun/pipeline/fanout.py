"""The fan-out producer: a period's unfinished entities as id ranges (shards) on a queue;
and named entities of a period, each its own message (``batchrun submit --period``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from batchrun.chunks import chunks
from batchrun.errors import UsageError
from batchrun.job import Job
from batchrun.period import Period
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.pager import page, recheck, unfinished
from batchrun.pipeline.reports import FanOut
from batchrun.pipeline.run import scope_of
from batchrun.pipeline.wiring import Wiring
from batchrun.queue.base import QueueMessage, WorkQueue

SEND_BATCH = 10  # SQS's SendMessageBatch limit


async def fan_out(
    w: Wiring, stop: StopToken, job: Job, period: Period, queue: WorkQueue, *, shard_size: int
) -> FanOut:
    """Walk the job's pages (reads only) and queue ranges of ``shard_size`` unfinished
    entities; consumers work each range like a run."""
    started = time.monotonic()
    result = FanOut(job.name, str(period), month=str(period) if period.unit == "month" else None)
    ctx, _ = w.effects.context(job, period, stop=stop, dry_run=True)
    scope = scope_of(ctx)
    after = cursor = 0
    batch: list[str] = []
    count = 0
    while True:
        rows = await page(job, ctx, cursor, min(shard_size - count, 1000) or shard_size)
        if rows:
            cursor = rows[-1]["id"]
            count += len(unfinished(rows, await w.store.claims_of(scope, [r["id"] for r in rows])))
        if count >= shard_size or (not rows and count):
            batch.append(
                QueueMessage(
                    "shard", job.name, str(period), after_id=after, until_id=cursor
                ).to_json()
            )
            result.users += count
            after, count = cursor, 0
        if len(batch) == SEND_BATCH or (not rows and batch):
            await queue.send(batch)
            result.shards += len(batch)
            batch = []
        if not rows:
            break
    result.duration_s = time.monotonic() - started
    return result


async def queue_entities(
    w: Wiring, stop: StopToken, job: Job, period: Period, ids: Sequence[int], queue: WorkQueue
) -> int:
    """Queue one task per entity of ``ids``; how many. UsageError, nothing queued, when the
    job's page does not return some of them for ``period`` (naming them)."""
    ctx, _ = w.effects.context(job, period, stop=stop, dry_run=True)
    absent = [i for i in dict.fromkeys(ids) if await recheck(job, ctx, i) is None]
    if absent:
        shown = ", ".join(str(i) for i in absent[:20]) + (" …" if len(absent) > 20 else "")
        raise UsageError(
            f"{job.name} {period}: the job's page does not return id {shown} "
            "(not eligible for this period); nothing queued"
        )
    bodies = [QueueMessage("task", job.name, str(period), entity_id=i).to_json() for i in ids]
    for batch in chunks(bodies, SEND_BATCH):
        await queue.send(batch)
    return len(bodies)

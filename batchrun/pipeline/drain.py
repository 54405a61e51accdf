"""A consumer's batch and its bookkeeping: received messages worked on the road while
their visibility is kept up, then settled (deleted, hidden, given back, dead-lettered) and
counted in entities; the failures a run could not queue, queued again; and, when the queue
is empty, submitted tasks whose message was lost, sent again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from batchrun.db.store import Scope, Store
from batchrun.job import Job
from batchrun.pipeline.apply import PAUSED, Disposition, settle_messages
from batchrun.pipeline.consume import Consumer
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.reports import RetrySummary
from batchrun.pipeline.run import Options
from batchrun.pipeline.wiring import Wiring
from batchrun.queue.base import QueueMessage, Received, WorkQueue
from batchrun.task import Task
from batchrun.tasks.store import TaskStore
from batchrun.tasks.sweep import sweep_idle

log = logging.getLogger(__name__)


async def work_batch(
    consumer: Consumer,
    queue: WorkQueue,
    items: list[Received],
    options: Options,
    result: RetrySummary,
    visibility_s: float,
) -> bool:
    """Work on received messages, then settle each by its disposition and count it in
    ``result``; whether the mail backend was found unreachable."""
    keepalive = asyncio.create_task(keep_invisible(queue, items, visibility_s))
    try:
        dispositions, broken, lost = await consumer.process(items, options)
    finally:
        keepalive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keepalive
    result.lost_claims += lost
    result.requeued += consumer.take_resent()  # lost tasks its messages waited behind
    for item in items:
        count(result, dispositions[item.message_id])
    await settle_messages(queue, items, dispositions)
    return broken


async def keep_invisible(queue: WorkQueue, items: list[Received], visibility_s: float) -> None:
    """Heartbeat: extend the messages' visibility while they are worked on, so a long
    shard is not delivered to a second consumer; a dead consumer's reappear."""
    while True:
        await asyncio.sleep(visibility_s / 3)
        for item in items:
            try:
                await queue.retry_later(item, visibility_s)
            except Exception as exc:
                log.warning("could not extend message %s: %s", item.message_id, exc)


async def requeue_unqueued(store: Store, queue: WorkQueue, jobs: Mapping[str, Job]) -> int:
    """Queue the temporary failures of ``jobs`` that a run could not queue (the queue was
    down); how many."""
    total = 0
    while True:
        rows = [r for r in await store.unqueued_failures(500) if r[0].job in jobs]
        if not rows:
            return total
        bodies = [
            QueueMessage(
                "retry",
                scope.job,
                scope.period,
                entity_id=entity_id,
                attempt=attempts,
                reason=error or "",
            ).to_json()
            for scope, entity_id, attempts, error in rows
        ]
        await queue.send(bodies)
        by_scope: dict[Scope, list[int]] = {}
        for scope, entity_id, _, _ in rows:
            by_scope.setdefault(scope, []).append(entity_id)
        for scope, ids in by_scope.items():
            await store.mark_queued(scope, ids)
        total += len(rows)


async def resend_lost_tasks(
    w: Wiring,
    queue: WorkQueue,
    jobs: Mapping[str, Job],
    stop: StopToken,
    *,
    in_flight: int | None = None,
) -> int:
    """On an empty queue: send again the lost tasks of the task jobs among ``jobs`` not
    paused, those nothing waits behind included (``tasks/sweep.py``); how many.
    ``in_flight``: the caller holds that many messages and does not know whether more
    wait (a Lambda's batch): the queue is asked first, and must hold no more."""
    tasks = {
        name: job.serial == "entity"
        for name, job in jobs.items()
        if isinstance(job, Task) and w.steering.paused(name, None) is None
    }
    if not tasks:
        return 0

    async def empty() -> bool:
        depth, _ = await queue.depths()
        return in_flight is not None and depth <= in_flight

    after_s, ask = w.settings.task_resend_s, None if in_flight is None else empty
    return await sweep_idle(
        TaskStore(w.store.db), queue, tasks, after_s=after_s, stop=stop, empty=ask
    )


def count(result: RetrySummary, verdict: Disposition) -> None:
    """Add one processed message's disposition to the totals, in entities."""
    if verdict.summary is not None:
        result.add_run(verdict.summary)
    elif verdict.unknown_job is not None:
        result.unknown_job += 1
        result.unknown_jobs.add(verdict.unknown_job)
    elif verdict.not_eligible:
        result.not_eligible += 1
    elif verdict.busy:
        result.busy += 1  # given back: its backend was busy (no attempt)
    elif verdict.reason == PAUSED:
        result.paused += 1  # given back unworked: its job is paused
    elif verdict.keep and verdict.action == "later":
        # a task waiting for its entity's turn: due back after its delay (one waiting for
        # its retry time holds no idle exit, as its retry does not)
        if verdict.awaited:
            due = time.monotonic() + verdict.delay_s
            result.waiting_until = max(result.waiting_until, due)
    elif verdict.action == "poison":
        result.processed += 1  # a message that named no entity, dead-lettered unworked
        result.poison += 1
        result.dead_lettered += 1
    elif verdict.counted and verdict.outcome is not None:
        result.add_entity(verdict.outcome)
        result.unknown_outcome += verdict.unknown

"""Consuming ``entity_task`` messages: each task once, one entity's tasks one at a time.

A message names a submitted task by its key; its data waits in ``batchrun_entity_task``.
To run it a process takes the entity's turn (a lease in ``batchrun_entity_turn``) and
checks that the task is the entity's oldest unfinished one: so one entity's tasks never
overlap, in any process or Lambda, and run in submission order. A task that is not its
entity's turn yet goes back to the queue with a short delay, kept (no attempt counted,
never dead-lettered for waiting). Entities run in parallel up to ``--concurrency``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from batchrun.db.store import State
from batchrun.period import current
from batchrun.pipeline.consume import Verdict
from batchrun.pipeline.outcomes import SUCCEEDED, Outcome, classify
from batchrun.pipeline.run import Options
from batchrun.queue.base import QueueMessage, Received
from batchrun.task import Task, TaskItem
from batchrun.tasks.store import TaskState, TaskStore

if TYPE_CHECKING:
    from batchrun.runtime.runtime import Runtime

log = logging.getLogger(__name__)
TURN_WAIT_S = 0.5  # a task waiting for its entity's turn looks again after about this long
WAITING = "waiting for its entity's turn"


async def serve(
    rt: Runtime, entries: Sequence[tuple[Received, QueueMessage]], options: Options
) -> dict[str, Verdict]:
    """One verdict per message (by message id): entities in parallel, each one's in order."""
    store = TaskStore(rt.store.db)
    me = uuid.uuid4().hex
    by_entity: dict[tuple[str, int], list[tuple[Received, QueueMessage]]] = {}
    for item, message in entries:
        by_entity.setdefault((message.job, message.entity_id), []).append((item, message))
    gate = asyncio.Semaphore(max(1, options.concurrency))
    verdicts: dict[str, Verdict] = {}

    async def one_entity(group: list[tuple[Received, QueueMessage]]) -> None:
        async with gate:
            for item, message in group:
                verdicts[item.message_id] = await _one(rt, store, me, message, options)

    await asyncio.gather(*(one_entity(group) for group in by_entity.values()))
    return verdicts


async def _one(
    rt: Runtime, store: TaskStore, me: str, message: QueueMessage, options: Options
) -> Verdict:
    job = rt.jobs[message.job]
    if not isinstance(job, Task):
        return Verdict("poison", f"poison: job {job.name!r} is not a task job")
    row = await store.get(job.name, message.key)
    if row is None or row.entity_id != message.entity_id:
        return Verdict("poison", f"poison: no task {message.key!r} for entity {message.entity_id}")
    if row.state.final:
        return Verdict("delete", counted=False)  # done already (a duplicate message)
    lease_s = rt.settings.lease_s
    serial = job.serial == "entity"
    if serial and not await store.take_turn(job.name, row.entity_id, me, lease_s):
        return _wait()
    try:
        if serial and await store.first_unfinished(job.name, row.entity_id) != message.key:
            return _wait()  # an older task of the entity goes first
        if not await store.start(row.id, me, lease_s):
            return _wait()  # another process runs it (its lease is live)
        outcome = await _run(
            rt, store, job, row.id, me, TaskItem(row.entity_id, message.key, row.data)
        )
        outcome = rt.policy(job).settle(outcome, row.attempts, at_once=False)
        state = {
            State.SENT: TaskState.SUCCEEDED,
            State.SKIPPED: TaskState.SUCCEEDED,
            State.FAILED: TaskState.DEAD,
        }.get(outcome.state, TaskState.FAILED)
        if not await store.finish(row.id, me, state, outcome.reason):
            log.warning("%s task %s: lease lost, its end not recorded", job.name, message.key)
            return Verdict("later", "lease lost", delay_s=lease_s, counted=False)
    finally:
        if serial:
            await store.release_turn(job.name, row.entity_id, me)
    if state is TaskState.SUCCEEDED:
        return Verdict("delete", outcome=outcome.state)
    if state is TaskState.DEAD:
        return Verdict("dead", outcome.reason or "failed", outcome=State.FAILED)
    return Verdict(
        "later", outcome.reason or "", delay_s=outcome.delay_s or 0.0, outcome=State.RETRYING
    )


def _wait() -> Verdict:
    delay = TURN_WAIT_S * random.uniform(0.5, 1.5)
    return Verdict("later", WAITING, delay_s=delay, counted=False, keep=True)


async def _run(
    rt: Runtime, store: TaskStore, job: Task, task_id: int, me: str, task: TaskItem
) -> Outcome:
    """One attempt, the leases kept alive meanwhile."""
    lease_s = rt.settings.lease_s

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                await store.extend(job.name, task.entity_id, task_id, me, lease_s)
            except Exception as exc:
                log.warning("%s task %s: lease not extended: %s", job.name, task.key, exc)

    ctx, _ = rt.context(job, current(job.period), breaker=rt.breaker)
    child = ctx.entity(task.entity_id)
    child.key = f"{job.name}:{task.key}"  # the task's idempotency key
    beat = asyncio.create_task(heartbeat())
    try:
        await job.process(child, task)
    except Exception as exc:
        return classify(exc)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    return SUCCEEDED

"""Submitted tasks on the road: each task once, one entity's tasks one at a time.

A message names a submitted task by its key; its data waits in ``batchrun_entity_task``.
To run it a process takes the entity's turn (a lease in ``batchrun_entity_turn``) and
checks that the task is the entity's oldest unfinished one: so one entity's tasks never
overlap, in any process or Lambda, and run in submission order. A task that is not its
entity's turn yet goes back to the queue with a short delay, kept (no attempt counted,
never dead-lettered for waiting). Entities run in parallel up to ``--concurrency``; one
entity's tasks in a batch follow each other, the next started once the last has its
outcome. Both leases (the task's, the turn's) are on the database server's clock and
kept alive by one heartbeat (``TaskClaims``, in task_claim.py). Each entity's first task
of a batch is claimed with the others' in a few statements (``task_claim.first_wave``),
the rest one at a time (``TaskRoad._next``); ends alike are recorded in one statement a
flush, and an entity's turn is let go in the same flush as its last end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence

from batchrun.db.store import Scope, State
from batchrun.job import Job
from batchrun.period import current
from batchrun.pipeline.apply import Applier, Disposition
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.item import Item
from batchrun.pipeline.outcomes import Outcome
from batchrun.pipeline.road import travel
from batchrun.pipeline.run import Options
from batchrun.pipeline.task_claim import TaskClaims, first_wave
from batchrun.pipeline.wiring import Wiring
from batchrun.pipeline.work import EntityWorker
from batchrun.policy.bugs import BugStreak
from batchrun.policy.pacing import CircuitBreaker
from batchrun.queue.base import QueueMessage, Received
from batchrun.task import Task, TaskItem
from batchrun.tasks.resend import LostTaskSweep
from batchrun.tasks.store import TaskRow, TaskState, TaskStore

log = logging.getLogger(__name__)
TURN_WAIT_S = 0.5  # a task waiting for its entity's turn looks again after about this long
TURN_WAIT_MAX_S = 60.0  # ... doubling with each receive, up to this
WAITING = "waiting for its entity's turn"
RETRY_WAIT = "waiting for its retry time"

Entry = tuple[Received, QueueMessage]


class TaskRoad:
    """Runs the tasks a batch of messages names; one disposition per message."""

    def __init__(
        self,
        w: Wiring,
        jobs: Mapping[str, Job],
        stop: StopToken,
        breaker: CircuitBreaker,
        bugs: BugStreak,
        lost_tasks: LostTaskSweep | None = None,
    ) -> None:
        self.w = w
        self.jobs = jobs
        self.stop = stop
        self.breaker = breaker
        self.bugs = bugs
        self.lost_tasks = lost_tasks
        self.store = TaskStore(w.store.db, w.store.run_id)

    async def process(self, entries: Sequence[Entry], options: Options) -> dict[str, Disposition]:
        found: dict[str, Disposition] = {}
        by_job: dict[str, list[Entry]] = {}
        for received, message in entries:
            job = self.jobs[message.job]
            if not isinstance(job, Task):
                found[received.message_id] = Disposition(
                    "poison", f"poison: job {job.name!r} is not a task job"
                )
            else:
                by_job.setdefault(job.name, []).append((received, message))
        # Each job's tasks side by side, the batch's concurrency shared out (one job's slow
        # tasks held up another's, whose entities are others).
        share = max(1, -(-options.concurrency // max(1, len(by_job))))
        each = dataclasses.replace(options, concurrency=share)
        done = await asyncio.gather(
            *(self._job(self._task(name), mine, each) for name, mine in by_job.items()),
            return_exceptions=True,  # each job's batch ends as it would alone
        )
        for dispositions in done:
            if isinstance(dispositions, BaseException):
                raise dispositions
            found.update(dispositions)
        return found

    def _task(self, name: str) -> Task:
        job = self.jobs[name]
        assert isinstance(job, Task)
        return job

    async def _job(
        self, job: Task, entries: list[Entry], options: Options
    ) -> dict[str, Disposition]:
        found: dict[str, Disposition] = {}
        groups: dict[int, deque[Entry]] = {}
        for entry in entries:
            groups.setdefault(entry[1].entity_id, deque()).append(entry)
        stop = self.stop.child()
        settings = self.w.settings
        finished: asyncio.Queue[int] = asyncio.Queue()
        lost_finish: set[str] = set()  # messages whose task's end could not be recorded
        try:
            async with TaskClaims(
                self.store, job.name, lease_s=settings.lease_s, stop=stop, steering=self.w.steering
            ) as claims:

                async def write(batch: Sequence[tuple[Item, Outcome]]) -> None:
                    alike: dict[TaskState, list[Item]] = {}  # ended without a message
                    lost: list[Item] = []
                    clock: int | None = None  # the server's, read once for retry times
                    for item, outcome in batch:
                        assert item.task_id is not None
                        claims.running.pop(item.task_id, None)
                        if outcome.busy:
                            await self.store.release(item.task_id, claims.me)
                            continue
                        state = _task_state(outcome)
                        delay_s = (outcome.delay_s or 0.0) if state is TaskState.FAILED else 0.0
                        retry_at = None
                        if delay_s > 0:  # not before: a second message of it waits
                            clock = clock or await self.store.db.clock_ms()
                            retry_at = clock + int(delay_s * 1000)
                        if outcome.reason is None and retry_at is None:
                            alike.setdefault(state, []).append(item)
                        elif not await self.store.finish(
                            item.task_id, claims.me, state, outcome.reason, retry_at
                        ):
                            lost.append(item)
                    for state, items in alike.items():
                        ids = [i.task_id for i in items if i.task_id is not None]
                        done = await self.store.finish_many(ids, claims.me, state)
                        lost.extend(i for i in items if i.task_id not in done)
                    # An entity with no message left in the batch lets its turn go now.
                    free = {i.id for i, _ in batch if not groups.get(i.id)}
                    free &= {e for j, e in claims.turns if j == job.name}
                    claims.turns.difference_update((job.name, e) for e in free)
                    await self.store.release_turns(job.name, sorted(free), claims.me)
                    for item in lost:
                        log.warning(
                            "%s task %s: lease lost, its end not recorded", job.name, item.key
                        )
                        assert item.message is not None
                        lost_finish.add(item.message.message_id)

                applier = Applier(write)
                limiter = await self.w.effects.limiter(options.rate)
                ctx, _ = self.w.effects.context(
                    job,
                    current(job.period),
                    lease=claims,  # type: ignore[arg-type]
                    stop=stop,
                    limiter=limiter,
                    breaker=self.breaker,
                )
                worker = EntityWorker(
                    job,
                    ctx,
                    lease=claims,
                    applier=applier,
                    breaker=self.breaker,
                    stop=stop,
                    limiter=limiter,
                    policy=self.w.policy(job),
                    at_once=False,
                    bugs=self.bugs,
                    on_done=lambda item: finished.put_nowait(item.id),
                    busy_wait_s=settings.busy_wait_s,
                )
                source = self._source(job, groups, claims, found, finished, stop)
                try:
                    leftover = await travel(
                        source,
                        worker,
                        concurrency=options.concurrency,
                        stop=stop,
                        grace_s=options.grace_s,
                        on_progress=options.on_progress,
                    )
                finally:
                    await applier.close()
                for item in leftover:
                    assert item.task_id is not None and item.message is not None
                    claims.running.pop(item.task_id, None)
                    await self.store.release(item.task_id, claims.me)
                    found[item.message.message_id] = _wait(0.0)
                for received, _ in (e for g in groups.values() for e in g):
                    found.setdefault(received.message_id, _wait())  # never started: stopped
                held = sorted(entity for _, entity in claims.turns)
                claims.turns.clear()
                await self.store.release_turns(job.name, held, claims.me)
        finally:
            stop.detach()
        found.update(applier.dispositions)
        for message_id in lost_finish:  # looked at again later, whatever its outcome was
            found[message_id] = Disposition(
                "later", "lease lost", delay_s=settings.lease_s, counted=False
            )
        for item in worker.lost:
            if item.message is not None:
                found[item.message.message_id] = Disposition(
                    "later", "lease lost", delay_s=settings.lease_s, counted=False
                )
        for received, _ in entries:
            found.setdefault(received.message_id, _wait())
        if self.lost_tasks is not None and job.serial == "entity":  # what they wait behind
            waiting = [m.entity_id for r, m in entries if found[r.message_id].keep]
            await self.lost_tasks.behind(job.name, waiting, {m.key for _, m in entries})
        return found

    async def _source(
        self,
        job: Task,
        groups: dict[int, deque[Entry]],
        claims: TaskClaims,
        found: dict[str, Disposition],
        finished: asyncio.Queue[int],
        stop: StopToken,
    ) -> AsyncIterator[Item]:
        """Each entity's next task, once its last one has its outcome; the first ones of
        the batch claimed at once (``first_wave``)."""
        active = 0
        claims.young()
        wave = await first_wave(
            self.store,
            job,
            groups,
            me=claims.me,
            lease_ms=claims.lease_ms,
            turns=claims.turns,
            running=claims.running,
            found=found,
            wait=turn_wait,
            item=_item,
        )
        for entity in list(groups):
            if entity in wave:
                item = wave[entity]
            else:
                item = await self._next(job, entity, groups, claims, found)
            if item is not None:
                active += 1
                yield item
        while active and not stop.stopping:
            done = await _next_finished(finished, stop)
            if done is None:
                return
            item = await self._next(job, done, groups, claims, found)
            if item is None:
                active -= 1
            else:
                yield item

    async def _next(
        self,
        job: Task,
        entity: int,
        groups: dict[int, deque[Entry]],
        claims: TaskClaims,
        found: dict[str, Disposition],
    ) -> Item | None:
        """Start the entity's next task of the batch; None when it has none it can run
        now (each message left has its disposition then, and the turn is let go)."""
        group = groups.get(entity)
        serial = job.serial == "entity"
        lease_s = self.w.settings.lease_s
        retry_in_s = 0.0  # a failed task's retry time not come yet: they wait for it
        while group:
            received, message = group[0]
            row = await self.store.get(job.name, message.key)
            if row is None or row.entity_id != message.entity_id:
                group.popleft()
                found[received.message_id] = Disposition(
                    "poison", f"poison: no task {message.key!r} for entity {message.entity_id}"
                )
                continue
            if row.state.final:
                group.popleft()
                found[received.message_id] = Disposition("delete", counted=False)  # done
                continue
            if serial and (job.name, entity) not in claims.turns:
                claims.young()
                if not await self.store.take_turn(job.name, entity, claims.me, lease_s):
                    break  # another process runs one of the entity's tasks now
                claims.turns.add((job.name, entity))
            if serial and await self.store.first_unfinished(job.name, entity) != message.key:
                break  # an older task of the entity goes first
            claims.young()
            if not await self.store.start(row.id, claims.me, lease_s):
                if row.retry_at is not None:  # or its retry time has not come
                    retry_in_s = (row.retry_at - await self.store.db.clock_ms()) / 1000
                break  # another process runs it (its lease is live)
            group.popleft()
            claims.running[row.id] = (job.name, entity)
            return _item(job, row, received, message)
        for received, waiting in group or ():  # those of another task wait their turn
            ahead = retry_in_s if group and waiting.key == group[0][1].key else 0.0
            found.setdefault(received.message_id, turn_wait(received.receive_count, ahead))
        if group is not None:
            group.clear()
        if (job.name, entity) in claims.turns:
            claims.turns.discard((job.name, entity))
            await self.store.release_turn(job.name, entity, claims.me)
        return None


def _item(job: Task, row: TaskRow, received: Received, message: QueueMessage) -> Item:
    return Item(
        Scope(job.name, "", ""),
        row.entity_id,
        attempts=row.attempts,
        message=received,
        payload=TaskItem(row.entity_id, message.key, row.data),
        key=f"{job.name}:{message.key}",  # the task's idempotency key
        task_id=row.id,
    )


def _task_state(outcome: Outcome) -> TaskState:
    return {
        State.SUCCEEDED: TaskState.SUCCEEDED,
        State.SKIPPED: TaskState.SUCCEEDED,
        State.FAILED: TaskState.DEAD,
    }.get(outcome.state, TaskState.FAILED)


def _wait(around_s: float = TURN_WAIT_S) -> Disposition:
    delay = around_s * random.uniform(0.5, 1.5)
    return Disposition("later", WAITING, delay_s=delay, counted=False, keep=True)


def turn_wait(receives: int, retry_in_s: float = 0.0) -> Disposition:
    """A task that is not its entity's turn yet: back after a delay that doubles with each
    receive (``TURN_WAIT_S`` first, ``TURN_WAIT_MAX_S`` at most), so one waiting behind a
    long task, or behind one waiting for its retry, does not cost a receive (a Lambda
    invocation) every half second.

    A message of a failed task whose retry time is ``retry_in_s`` away (a duplicate
    delivery, or a copy sent again while it waited) comes back just after that time
    instead; as the task's own retry, it holds no worker's ``--idle-exit``."""
    if retry_in_s > 0:
        delay = retry_in_s + random.uniform(0.0, TURN_WAIT_S)
        return Disposition(
            "later", RETRY_WAIT, delay_s=delay, counted=False, keep=True, awaited=False
        )
    return _wait(min(TURN_WAIT_MAX_S, TURN_WAIT_S * 2 ** min(max(0, receives - 1), 16)))


async def _next_finished(finished: asyncio.Queue[int], stop: StopToken) -> int | None:
    """The next entity whose task left the worker, or None once ``stop`` is stopping."""
    if not finished.empty():
        return finished.get_nowait()
    task = asyncio.ensure_future(finished.get())
    stopping = asyncio.ensure_future(stop.wait_stopping())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
    if task.done():
        return task.result()
    task.cancel()
    return None

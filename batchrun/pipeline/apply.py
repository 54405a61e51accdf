"""The end of the road: each entity's outcome becomes its ledger write and its next action
(done, later after a delay, dead), for a period run, a drain, a worker and the Lambda alike.

    outcome      ledger (group commit)        next action
    succeeded    SENT                         done: a message that asked for it is deleted
    skipped      SKIPPED                      done
    retrying     RETRYING (attempts + 1)      later: a page's entity gets one retry message
                                              (visible after the delay); a message is hidden
                                              for the delay
    failed       FAILED                       dead: to the dead-letter queue
    busy         released (no attempt)        later, given back: its message comes back as
                                              new after a delay that grows each time
                                              (no receive counts against it)

A worker takes its next entity only after its last outcome is durable, so at most
``concurrency`` finished effects are ever unrecorded: that bounds the one duplicate window
a crash can open. An entity that already has a retry message waiting (``queued`` in the
ledger) is not queued again, and a consumer finds a message for a finished entity and
deletes it.

Messages are settled once their batch is worked (``settle_messages``): deleted, hidden,
kept or dead-lettered by the CLI's drain and worker; for the Lambda's SQS event source
the same dispositions become ``batchItemFailures``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from batchrun.db.store import Scope, State, Store
from batchrun.errors import BatchrunError, QueueError
from batchrun.pipeline.item import Item
from batchrun.pipeline.outcomes import Outcome
from batchrun.queue.base import QueueMessage, Received, WorkQueue

if TYPE_CHECKING:
    from batchrun.pipeline.lease import Lease
    from batchrun.pipeline.reports import Summary

log = logging.getLogger(__name__)
FLUSH_ROWS = 1000
PAUSED = "paused"  # the reason of a message given back because its job is paused


@dataclass(frozen=True, slots=True)
class Disposition:
    """What to do with one received queue message after its batch was worked."""

    action: Literal["delete", "later", "dead", "poison"]
    reason: str = ""
    delay_s: float = 0.0
    outcome: State | None = None  # the entity's outcome, when the message named one
    summary: Summary | None = None  # the run a continuation or shard message started
    counted: bool = True  # False for a second message naming an entity already counted
    not_eligible: bool = False  # the page does not return its entity: dropped, ledger as was
    unknown_job: str | None = None  # a job this process does not know: kept on the queue
    unknown: bool = False  # the job's statement lost its reply (unknown_outcome)
    keep: bool = False  # kept on the queue, no receive counted (a task waiting its turn)
    awaited: bool = True  # kept: a worker's --idle-exit waits for it (not for a retry time)
    busy: bool = False  # its backend was busy: given back (``WorkQueue.give_back``)
    body: str | None = None  # the body it is given back with (its ``busy`` count one up)


def disposition(outcome: Outcome) -> Disposition:
    """The next action for the message that asked for an entity, by its settled outcome."""
    if outcome.state in (State.SUCCEEDED, State.SKIPPED):
        return Disposition("delete", outcome=outcome.state)
    if outcome.state is State.FAILED:
        return Disposition("dead", outcome.reason or "failed", outcome=State.FAILED)
    if outcome.busy:
        # The consumer sets the delay and the body (``Consumer.give_back``); ``delay_s``
        # is what the backend asked for meanwhile (a Retry-After).
        return Disposition(
            "later",
            outcome.reason or "busy",
            delay_s=outcome.delay_s or 0.0,
            counted=False,
            keep=True,
            busy=True,
        )
    return Disposition(
        "later",
        outcome.reason or "",
        delay_s=outcome.delay_s or 0.0,
        outcome=State.RETRYING,
        unknown=outcome.unknown,
    )


Write = Callable[[Sequence[tuple[Item, Outcome]]], Awaitable[None]]


class Applier:
    """Group commit of outcomes, and the next action of each entity.

    Args:
        write: writes a batch of outcomes to their ledger (``LedgerWrites.write`` for a
            period's entities; the tasks' table for submitted tasks).
        dispositions: where the next action of an entity a message asked for goes (by
            message id); settled by ``settle_messages`` once the batch is worked.
    """

    def __init__(self, write: Write, dispositions: dict[str, Disposition] | None = None) -> None:
        self._write = write
        self.dispositions = dispositions if dispositions is not None else {}
        self._pending: list[tuple[Item, Outcome, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def record(self, item: Item, outcome: Outcome) -> None:
        """Write ``item``'s outcome (returns once it is durable); note its message's action."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((item, outcome, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future
        if item.message is not None:
            self.dispositions[item.message.message_id] = disposition(outcome)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:FLUSH_ROWS], self._pending[FLUSH_ROWS:]
            try:
                await self._write([(i, o) for i, o, _ in batch])
            except BaseException as exc:
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for _, _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


class LedgerWrites:
    """Outcomes of a period's entities in ``batchrun_ledger``: one UPDATE per (scope,
    state, reason); a page's failures queued, one message per entity.

    Args:
        enqueue: a page's entities (a run): retries and dead letters go on the queue. A
            consumer's entities already have their message, which the disposition reuses.
    """

    def __init__(
        self,
        store: Store,
        queue: WorkQueue | None,
        lease: Lease,
        *,
        summary: Summary | None,
        enqueue: bool,
    ) -> None:
        self.store = store
        self.queue = queue
        self.lease = lease
        self.summary = summary
        self.enqueue = enqueue

    async def write(self, batch: Sequence[tuple[Item, Outcome]]) -> None:
        """Write outcomes: one UPDATE per scope for all succeeded, one per failure reason
        (and retry delay); busy entities are released, their attempt not counted."""
        groups: dict[tuple[Scope, State, str | None, bool, float], list[Item]] = {}
        busy: dict[Scope, list[int]] = {}
        for item, outcome in batch:
            if outcome.busy:
                busy.setdefault(item.scope, []).append(item.id)
                continue
            reason = None if outcome.state is State.SUCCEEDED else outcome.reason
            waiting = item.queued and outcome.state is State.RETRYING
            delay = (outcome.delay_s or 0.0) if outcome.state is State.RETRYING else 0.0
            groups.setdefault((item.scope, outcome.state, reason, waiting, delay), []).append(item)
        for scope, ids in busy.items():
            await self.lease.release(scope, ids)
        for (scope, state, reason, waiting, delay), items in groups.items():
            queued = not self.enqueue
            if self.enqueue and state in (State.RETRYING, State.FAILED):
                queued = waiting or await self._enqueue(scope, state, reason or "", items, delay)
                if waiting and self.summary is not None:
                    self.summary.queued_for_retry += len(items)
            ids = [i.id for i in items]
            # Let go first: a heartbeat between the write and let_go would find these rows
            # not renewed and count this run's own finished rows as lost. A row another
            # run really took is still counted, once, by the write's rowcount below.
            self.lease.let_go(scope, ids)
            changed = await self.store.finish(
                scope, ids=ids, me=self.lease.me, state=state, error=reason, queued=queued
            )
            if changed < len(ids):
                lost = self.lease.note_lost(scope, ids, changed, "recorded them")
                if self.summary is not None:
                    self.summary.lost_claims += lost
                    # The other run's now: two runs' counts still add up to the period's.
                    taken = len(ids) - changed
                    if state is State.SUCCEEDED:
                        self.summary.succeeded -= taken
                    elif state is State.SKIPPED:
                        self.summary.skipped -= taken
                    else:
                        self.summary.failed -= taken

    async def _enqueue(
        self, scope: Scope, state: State, reason: str, items: list[Item], delay_s: float = 0.0
    ) -> bool:
        """Queue one message per entity (a retry, visible after ``delay_s``, or a dead
        letter); whether they went."""
        if self.queue is None:
            return False
        bodies = [
            QueueMessage(
                "retry",
                scope.job,
                scope.period,
                entity_id=i.id,
                attempt=i.attempts + 1,
                reason=reason,
            ).to_json()
            for i in items
        ]
        try:
            if state is State.FAILED:
                await self.queue.send_dead([(b, reason) for b in bodies])
            elif delay_s > 0:
                await self.queue.send(bodies, delay_s=delay_s)
            else:
                await self.queue.send(bodies)
        except QueueError as exc:
            log.error(
                "retry queue unreachable; %d failures stay in the ledger: %s", len(items), exc
            )
            if self.summary is not None and state is State.RETRYING:
                self.summary.not_queued += len(items)
            return False
        if self.summary is not None:
            if state is State.FAILED:
                self.summary.dead_lettered += len(items)
            else:
                self.summary.queued_for_retry += len(items)
        return state is State.RETRYING


async def settle_messages(
    queue: WorkQueue,
    items: Sequence[Received],
    dispositions: Mapping[str, Disposition],
    *,
    event_source: bool = False,
) -> list[Received]:
    """Delete, hide, keep or dead-letter each received message by its disposition.

    A message without one (its batch stopped first) comes back later. With
    ``event_source`` (the Lambda's SQS event source mapping) nothing is deleted here: the
    messages returned are the batch's failures (``batchItemFailures``), the rest SQS
    deletes; a dead or poison one goes straight to the dead-letter queue (logged and
    dropped when there is none) and is no failure, so it is never delivered again; a failure to
    hide one is logged (SQS's own visibility timeout applies then). A busy one given back
    as a fresh copy (a standard SQS queue, ``DelaySeconds``) is no failure either: SQS
    deletes the original, and its receive count never grows for busy answers.
    """
    failed: list[Received] = []
    done: list[Received] = []
    for item in items:
        verdict = dispositions.get(item.message_id, Disposition("later"))
        if verdict.busy and verdict.body is not None:
            if await _given_back(queue, item, verdict, event_source=event_source):
                done.append(item)  # a fresh copy waits: the original goes
            elif event_source:
                failed.append(item)
        elif verdict.action == "delete":
            done.append(item)
        elif verdict.action in ("dead", "poison") and event_source:
            await queue.send_dead([(item.body, verdict.reason)])
        elif verdict.action in ("dead", "poison"):
            await queue.dead_letter(item, verdict.reason)
        else:
            keep = verdict.keep or verdict.unknown_job is not None
            if keep or verdict.delay_s > 0 or not event_source:
                # Kept, whatever the reason: where one more receive could reach the queue's
                # redrive limit, an SQS queue gets a fresh copy. The retry policy (the
                # ledger's attempts) decides when an entity is dead, so a receive that was
                # no attempt, or a job's policy of more attempts than the limit, never has
                # the redrive policy dead-letter it while the ledger says retrying.
                if event_source:
                    await _quietly(item, queue.keep(item, verdict.delay_s))
                else:
                    await queue.keep(item, verdict.delay_s)
            if event_source:
                failed.append(item)
    if done and not event_source:
        await queue.delete(done)
    return failed


async def _given_back(
    queue: WorkQueue, item: Received, verdict: Disposition, *, event_source: bool
) -> bool:
    """Give a busy message back; whether a fresh copy was queued (the original goes)."""
    assert verdict.body is not None
    try:
        return await queue.give_back(item, verdict.body, verdict.delay_s)
    except BatchrunError as exc:
        if not event_source:
            raise
        # Left to the visibility timeout: it comes back (a receive counted, this once).
        log.warning("could not give busy message %s back: %s", item.message_id, exc)
        return False


async def _quietly(item: Received, call: Awaitable[None]) -> None:
    try:
        await call
    except BatchrunError as exc:
        log.warning("could not back off message %s: %s", item.message_id, exc)

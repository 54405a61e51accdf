"""Group commit of outcomes: a worker's ``record`` returns once its ledger row is written.

A worker takes its next entity only after its last outcome is durable, so at most
``concurrency`` finished effects are ever unrecorded: that bounds the one duplicate window
a crash can open. Failures reach the retry queue here too, one message per entity: an
entity that already has a retry message waiting (``queued`` in the ledger) is not queued
again, and a consumer finds a message for a finished entity and deletes it. A retry
message goes out after the outcome's delay (the job's ``Retry(delay_s)``, a peer's
``Retry-After``, as the job's RetryPolicy settled it), so no consumer works it sooner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from batchrun.db.store import Scope, State, Store
from batchrun.errors import QueueError
from batchrun.pipeline.lease import Lease
from batchrun.pipeline.outcomes import Outcome
from batchrun.pipeline.reports import Summary
from batchrun.queue.base import QueueMessage, RetryQueue

log = logging.getLogger(__name__)
FLUSH_ROWS = 1000


@dataclass(slots=True)
class Item:
    """One claimed entity: where its ledger row is, its page row, how its claim stood."""

    scope: Scope
    id: int
    row: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0  # finished attempts before this one (from the ledger)
    queued: bool = False  # a retry message for it already waits on the queue


class Recorder:
    """Writes outcomes in batches: one UPDATE per (scope, state, reason)."""

    def __init__(
        self,
        store: Store,
        queue: RetryQueue | None,
        lease: Lease,
        *,
        summary: Summary | None,
        enqueue: bool,
    ) -> None:
        self.store = store
        self.queue = queue
        self.lease = lease
        self.summary = summary
        self.enqueue = enqueue  # False in a queue consumer: the message it works is reused
        self._pending: list[tuple[Item, Outcome, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def record(self, item: Item, outcome: Outcome) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((item, outcome, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:FLUSH_ROWS], self._pending[FLUSH_ROWS:]
            try:
                await self.write([(i, o) for i, o, _ in batch])
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

    async def write(self, batch: Sequence[tuple[Item, Outcome]]) -> None:
        """Write outcomes: one UPDATE per scope for all succeeded, one per failure reason
        (and retry delay)."""
        groups: dict[tuple[Scope, State, str | None, bool, float], list[Item]] = {}
        for item, outcome in batch:
            reason = None if outcome.state is State.SENT else outcome.reason
            waiting = item.queued and outcome.state is State.RETRYING
            delay = (outcome.delay_s or 0.0) if outcome.state is State.RETRYING else 0.0
            groups.setdefault((item.scope, outcome.state, reason, waiting, delay), []).append(item)
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
                    if state is State.SENT:
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

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)

"""Dead letters: list them, put them back on the queue (redrive), or drop them (purge).

The same async API over the local queue's dead rows and an SQS queue's dead-letter queue
(the one its RedrivePolicy names); ``batchrun dead`` and the dashboard call it::

    letters = await dead.list_dead(queue, limit=100)
    moved = await dead.redrive(queue, store, ids=[letters[0].id])   # ids=None: all of them
    dropped = await dead.purge(queue)

A redrive first revives the ledger rows of the entities the letters name (failed for good
-> retrying, attempts counted from zero), then makes the messages visible on the queue: a
consumer that took one before the revive would find the entity finished and do nothing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from batchrun.chunks import chunks
from batchrun.db.clock import server_clock
from batchrun.db.store import Store
from batchrun.errors import QueueError
from batchrun.queue.base import WorkQueue

KEYS_A_STATEMENT = 500  # task keys one revive names

Revive = Callable[[Sequence["DeadLetter"]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered message: its id on its queue, its body, why it died, and what it
    names (``kind``, ``job``, ``period``, ``entity_id``: None for a body that is not ours)."""

    id: str
    body: str
    reason: str = ""
    receive_count: int = 0
    sent_at_ms: int | None = None

    @property
    def fields(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def job(self) -> str | None:
        job = self.fields.get("job")
        return job if isinstance(job, str) else None

    @property
    def period(self) -> str | None:
        period = self.fields.get("period", self.fields.get("month"))
        return period if isinstance(period, str) else None

    @property
    def entity_id(self) -> int | None:
        value = self.fields.get("id", self.fields.get("user_id"))
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def kind(self) -> str | None:
        kind = self.fields.get("kind")
        return kind if isinstance(kind, str) else None

    @property
    def task_key(self) -> str | None:
        """The key of the submitted task it names (an ``entity_task``), else None."""
        key = self.fields.get("key")
        return key if self.kind == "entity_task" and isinstance(key, str) and key else None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "job": self.job,
            "period": self.period,
            "entity_id": self.entity_id,
            "reason": self.reason,
            "receive_count": self.receive_count,
            "sent_at_ms": self.sent_at_ms,
            "body": self.body,
        }


@runtime_checkable
class DeadLetterQueue(Protocol):
    """A queue that keeps its dead letters where they can be listed and moved back."""

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first where the queue knows the order."""
        ...

    async def redrive_dead(self, ids: Sequence[str] | None, revive: Revive) -> list[DeadLetter]:
        """Move the dead letters ``ids`` (None: all) back onto the queue, calling
        ``revive`` on each batch before its messages become visible; return those moved."""
        ...

    async def purge_dead(self) -> int:
        """Drop every dead letter; return how many there were (approximate on SQS)."""
        ...


def _dead_of(queue: WorkQueue) -> DeadLetterQueue:
    if not isinstance(queue, DeadLetterQueue):
        raise QueueError(f"the queue {queue.url} keeps no dead letters batchrun can read")
    return queue


async def list_dead(queue: WorkQueue, *, limit: int = 100) -> list[DeadLetter]:
    """The queue's dead letters, at most ``limit``; nothing changes.

    Raises:
        QueueError: the queue cannot be read, or (SQS) has no dead-letter queue.
    """
    return await _dead_of(queue).dead_letters(limit=limit)


async def redrive(
    queue: WorkQueue, store: Store, *, ids: Sequence[str] | None = None
) -> list[DeadLetter]:
    """Put dead letters back on the queue (``ids``, or every one when None), their
    entities' ledger rows revived first; return the letters moved (ids not found are
    left out)."""

    async def revive(letters: Sequence[DeadLetter]) -> None:
        await revive_ledger(store, letters)

    return await _dead_of(queue).redrive_dead(ids, revive)


async def purge(queue: WorkQueue) -> int:
    """Drop every dead letter of the queue; return how many."""
    return await _dead_of(queue).purge_dead()


async def revive_ledger(store: Store, letters: Sequence[DeadLetter]) -> int:
    """Failed-for-good ledger rows of the entities ``letters`` name -> retrying, with their
    attempts from zero and a message on the queue; dead submitted tasks they name ->
    pending, their attempts from zero (a worker found the task dead and dropped the
    redriven message unworked). Return how many rows changed."""
    groups: dict[tuple[str, str], list[int]] = {}
    tasks: dict[str, list[str]] = {}
    for letter in letters:
        job, period, entity, key = letter.job, letter.period, letter.entity_id, letter.task_key
        if job is not None and key is not None:
            tasks.setdefault(job, []).append(key)
        elif job is not None and period is not None and entity is not None:
            groups.setdefault((job, period), []).append(entity)
    changed = 0
    now = await server_clock(store.db).now_ms() if groups else 0
    for (job, period), ids in groups.items():
        changed += await store.db.execute(
            "ledger_revive", job=job, period=period, ids=sorted(set(ids)), now=now
        )
    for job, keys in tasks.items():
        for some in chunks(sorted(set(keys)), KEYS_A_STATEMENT):
            changed += await store.db.execute("task_revive", job=job, keys=some)
    return changed


__all__ = ["DeadLetter", "DeadLetterQueue", "list_dead", "purge", "redrive", "revive_ledger"]

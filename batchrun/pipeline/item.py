"""What travels the road: one claimed entity (or one submitted task), and where it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchrun.db.store import Scope
from batchrun.queue.base import Received


@dataclass(slots=True)
class Item:
    """One claimed entity: where its ledger row is, what ``process`` is given, how its
    claim stood, and the queue message that asked for it (None: a page's).

    A submitted task is an item too: ``payload`` is its ``TaskItem``, ``key`` its own
    idempotency key, ``task_id`` its row in ``batchrun_entity_task``.
    """

    scope: Scope
    id: int
    row: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0  # finished attempts before this one (from the ledger)
    queued: bool = False  # a retry message for it already waits on the queue
    message: Received | None = None  # the message that asked for it; None for a page's
    payload: Any = None  # what process() is given when not the row (a task's TaskItem)
    key: str | None = None  # the idempotency key when not the entity's (a task's own)
    task_id: int | None = None

    @property
    def argument(self) -> Any:
        """What ``process(ctx, ...)`` is given: the page row, or the task."""
        return self.row if self.payload is None else self.payload

"""The default retry queue: a table in the job's own database, with SQS semantics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from batchrun.db.base import Database, now_ms
from batchrun.errors import DatabaseError, QueueError
from batchrun.queue.base import Received


class LocalQueue:
    """A queue table: receive hides a batch under a fresh receipt in one statement."""

    def __init__(self, db: Database, *, max_receives: int = 5) -> None:
        self.db = db
        self.url = f"table batchrun_queue in {db.url}"
        self.max_receives = max_receives

    async def open(self) -> None:
        """Nothing to open: the table lives in the job's database."""

    async def check(self) -> None:
        """Read the table's depth: it exists and the database answers. The preflight of a
        run; nothing is written.

        Raises:
            QueueError: the table cannot be read (missing: run `batchrun db migrate`).
        """
        try:
            await self.db.fetchone("queue_depths")
        except DatabaseError as exc:
            raise QueueError(f"cannot read the queue table batchrun_queue: {exc}") from exc

    async def send(self, bodies: Sequence[str], *, delay_s: float = 0.0) -> None:
        if bodies:
            now = now_ms()
            visible_at = now + max(0, int(delay_s * 1000))
            rows = [(body, visible_at, 0, 0, None, now) for body in bodies]
            await self.db.execute("queue_send", rows=rows)

    async def send_dead(self, bodies: Sequence[tuple[str, str]]) -> None:
        if bodies:
            now = now_ms()
            rows = [(body, now, 0, 1, reason[:500], now) for body, reason in bodies]
            await self.db.execute("queue_send", rows=rows)

    async def receive(self, *, max_messages: int, visibility_s: float) -> list[Received]:
        receipt = uuid.uuid4().hex
        now = now_ms()
        changed = await self.db.execute(
            "queue_receive",
            receipt=receipt,
            until=now + int(visibility_s * 1000),
            now=now,
            limit=max_messages,
        )
        if not changed:
            return []
        rows = await self.db.fetchall("queue_received", receipt=receipt)
        return [Received(str(r[0]), receipt, str(r[1]), int(r[2])) for r in rows]

    async def delete(self, items: Sequence[Received]) -> None:
        if items:
            await self.db.execute("queue_delete", ids=[int(i.message_id) for i in items])

    async def retry_later(self, item: Received, delay_s: float) -> None:
        await self.db.execute(
            "queue_change_visibility",
            id=int(item.message_id),
            visible_at=now_ms() + int(delay_s * 1000),
        )

    async def dead_letter(self, item: Received, reason: str) -> None:
        await self.db.execute("queue_dead_letter", id=int(item.message_id), reason=reason[:500])

    async def depths(self) -> tuple[int, int | None]:
        row = await self.db.fetchone("queue_depths") or (0, 0)
        return int(row[0]), int(row[1])

    async def close(self) -> None:
        """The database is closed by its owner."""

"""The default retry queue: a table in the job's own database, with SQS semantics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from batchrun.chunks import chunks
from batchrun.db.base import Database, Row
from batchrun.db.clock import server_clock
from batchrun.errors import DatabaseError, QueueError, UsageError
from batchrun.queue.base import Received

if TYPE_CHECKING:
    from batchrun.queue.dead import DeadLetter, Revive

DEAD_PAGE = 500  # dead rows read (and redriven) per statement


class LocalQueue:
    """A queue table: receive hides a batch under a fresh receipt in one statement. Its
    times are on the database server's clock (``db/clock.py``): a message one host sends
    is visible to every other at once, and hidden for as long as it should be."""

    def __init__(self, db: Database, *, max_receives: int = 5) -> None:
        self.db = db
        self.clock = server_clock(db)
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
            now = await self.clock.now_ms()
            visible_at = now + max(0, int(delay_s * 1000))
            rows = [(body, visible_at, 0, 0, None, now) for body in bodies]
            await self.db.execute("queue_send", rows=rows)

    async def send_dead(self, bodies: Sequence[tuple[str, str]]) -> None:
        if bodies:
            now = await self.clock.now_ms()
            rows = [(body, now, 0, 1, reason[:500], now) for body, reason in bodies]
            await self.db.execute("queue_send", rows=rows)

    async def receive(self, *, max_messages: int, visibility_s: float) -> list[Received]:
        receipt = uuid.uuid4().hex
        now = await self.clock.now_ms()
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
        if not item.message_id.isdigit():
            # A record from elsewhere (an SQS event with this table configured as the queue).
            raise QueueError(f"message {item.message_id!r} is not a row of batchrun_queue")
        await self.db.execute(
            "queue_change_visibility",
            id=int(item.message_id),
            visible_at=await self.clock.now_ms() + int(delay_s * 1000),
        )

    async def give_back(self, item: Received, body: str, delay_s: float) -> bool:
        """The row itself, with ``body``, visible after ``delay_s``, its receives at 0."""
        if not item.message_id.isdigit():
            raise QueueError(f"message {item.message_id!r} is not a row of batchrun_queue")
        await self.db.execute(
            "queue_give_back",
            id=int(item.message_id),
            body=body,
            visible_at=await self.clock.now_ms() + int(delay_s * 1000),
        )
        return False

    async def dead_letter(self, item: Received, reason: str) -> None:
        await self.db.execute(
            "queue_dead_letter",
            id=int(item.message_id),
            reason=reason[:500],
            now=await self.clock.now_ms(),
        )

    async def keep(self, item: Received, delay_s: float) -> None:
        """Hide it for ``delay_s``: receives never dead-letter a message of this table."""
        await self.retry_later(item, delay_s)

    # -- dead letters (batchrun.queue.dead) ------------------------------------------------

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        letters: list[DeadLetter] = []
        after = 0
        while len(letters) < limit:
            rows = await self.db.fetchall(
                "dead_list", after=after, limit=min(DEAD_PAGE, limit - len(letters))
            )
            if not rows:
                break
            letters.extend(_letter(r) for r in rows)
            after = int(rows[-1][0])
        return letters

    async def redrive_dead(self, ids: Sequence[str] | None, revive: Revive) -> list[DeadLetter]:
        moved: list[DeadLetter] = []
        if ids is not None:
            wanted = sorted({_row_id(i) for i in ids})
            for some in chunks(wanted, DEAD_PAGE):
                rows = await self.db.fetchall("dead_by_ids", ids=some)
                moved.extend(await self._redrive([_letter(r) for r in rows], revive))
            return moved
        after = 0
        while rows := await self.db.fetchall("dead_list", after=after, limit=DEAD_PAGE):
            after = int(rows[-1][0])
            moved.extend(await self._redrive([_letter(r) for r in rows], revive))
        return moved

    async def _redrive(self, letters: list[DeadLetter], revive: Revive) -> list[DeadLetter]:
        if letters:
            await revive(letters)
            await self.db.execute(
                "dead_redrive",
                ids=[int(letter.id) for letter in letters],
                now=await self.clock.now_ms(),
            )
        return letters

    async def purge_dead(self) -> int:
        return await self.db.execute("dead_purge")

    async def depths(self) -> tuple[int, int | None]:
        row = await self.db.fetchone("queue_depths") or (0, 0)
        return int(row[0]), int(row[1])

    async def next_due_s(self) -> float | None:
        row = await self.db.fetchone("queue_next_visible")
        if row is None or row[0] is None:
            return None
        return max(0.0, (int(row[0]) - await self.clock.now_ms()) / 1000)

    async def close(self) -> None:
        """The database is closed by its owner."""


def _letter(row: Row) -> DeadLetter:
    from batchrun.queue.dead import DeadLetter

    return DeadLetter(str(row[0]), str(row[1]), str(row[3] or ""), int(row[2]), int(row[4]))


def _row_id(text: str) -> int:
    if not text.isdigit() or len(text) > 18:
        raise UsageError(f"--id {text!r}: the local queue's message ids are numbers")
    return int(text)

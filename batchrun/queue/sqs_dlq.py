"""An SQS queue's dead-letter queue (the one its RedrivePolicy names): list, redrive, purge,
and keeping a message out of it (``keep``). Mixed into ``SqsQueue``.

Listing receives the DLQ's messages (hidden for a moment) and makes them visible again at
once; a redrive sends each one back to the source queue and then deletes it from the DLQ,
so a crash in between leaves a copy on both, never on neither.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from batchrun.chunks import chunks
from batchrun.errors import QueueError
from batchrun.queue.base import Received
from batchrun.queue.dead import DeadLetter, Revive
from batchrun.queue.sqs_entries import delay_seconds

log = logging.getLogger(__name__)

BATCH = 10
LIST_HIDE_S = 30  # how long a listed message stays hidden before it is shown again
MOVE_HIDE_S = 120  # how long a message being redriven stays hidden


class SqsDeadLetters:
    """The dead-letter half of ``SqsQueue``."""

    if TYPE_CHECKING:
        url: str
        queue_url: str
        fifo: bool
        max_receives: int
        dlq_url: str | None

        @property
        def client(self) -> Any: ...

        async def open(self) -> None: ...

        async def retry_later(self, item: Received, delay_s: float) -> None: ...

        async def delete(self, items: Sequence[Received]) -> None: ...

        def _mapped(
            self, action: str, queue_url: str | None = None
        ) -> contextlib.AbstractContextManager[None]: ...

        def _entry(
            self,
            entry_id: str,
            body: str,
            fifo: bool,
            *,
            reason: str = "",
            dedup: str = "",
            call: str = "",
        ) -> dict[str, Any]: ...

        async def _send_batches(self, queue_url: str, entries: list[dict[str, Any]]) -> None: ...

    async def keep(self, item: Received, delay_s: float) -> None:
        """Hide ``item`` for ``delay_s``; when one more receive could reach the redrive
        limit, send a fresh copy (receive count 0) and delete this one instead: on a
        standard queue with ``DelaySeconds`` (at most 15 minutes), on a FIFO queue, which
        takes no per-message delay, visible at once."""
        await self.open()
        if self.dlq_url is None or item.receive_count + 1 < self.max_receives:
            await self.retry_later(item, delay_s)
            return
        # Its own deduplication id on a FIFO queue: the original's would drop the copy.
        entry = self._entry(
            "0", item.body, self.fifo, dedup=f"keep:{item.message_id}:{item.receive_count}"
        )
        if not self.fifo:
            entry["DelaySeconds"] = delay_seconds(delay_s)
        await self._send_batches(self.queue_url, [entry])
        await self.delete([item])

    async def give_back(self, item: Received, body: str, delay_s: float) -> bool:
        """A standard queue: a fresh copy with ``body`` and ``DelaySeconds`` (receives from
        0 again), and True (the caller deletes ``item``). A FIFO queue takes no
        per-message delay: ``item`` is hidden for ``delay_s`` instead (False), and a copy
        with ``body`` replaces it when one more receive could reach the redrive limit; the
        copy joins the end of its group, and the database's per-entity order check keeps
        the entity's tasks in submission order."""
        await self.open()
        if not self.fifo:
            entry = self._entry("0", body, False)
            entry["DelaySeconds"] = delay_seconds(delay_s)
            await self._send_batches(self.queue_url, [entry])
            return True
        if self.dlq_url is None or item.receive_count + 1 < self.max_receives:
            await self.retry_later(item, delay_s)
            return False
        entry = self._entry(
            "0", body, self.fifo, dedup=f"busy:{item.message_id}:{item.receive_count}"
        )
        await self._send_batches(self.queue_url, [entry])
        await self.delete([item])
        return False

    async def _dlq(self) -> str:
        await self.open()
        if self.dlq_url is None:
            raise QueueError(
                f"SQS queue {self.url} has no dead-letter queue (no RedrivePolicy): "
                "its dead letters are only in the logs"
            )
        return self.dlq_url

    async def _receive_dead(self, dlq: str, hide_s: int) -> list[dict[str, Any]]:
        with self._mapped("receive from", dlq):
            response = await self.client.receive_message(
                QueueUrl=dlq,
                MaxNumberOfMessages=BATCH,
                VisibilityTimeout=hide_s,
                WaitTimeSeconds=1,  # a long poll asks every server: a short one samples
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
                MessageAttributeNames=["reason"],
            )
        return list(response.get("Messages", []))

    async def _show(self, dlq: str, messages: Sequence[dict[str, Any]]) -> None:
        """Make received DLQ messages visible again now."""
        for batch in chunks(list(messages), BATCH):
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                for i, m in enumerate(batch)
            ]
            try:
                with self._mapped("change visibility in", dlq):
                    await self.client.change_message_visibility_batch(QueueUrl=dlq, Entries=entries)
            except QueueError as exc:  # they come back by themselves after the hide
                log.warning("dead letters stay hidden a little longer: %s", exc)

    async def dead_letters(self, *, limit: int) -> list[DeadLetter]:
        dlq = await self._dlq()
        seen: dict[str, dict[str, Any]] = {}
        received: list[dict[str, Any]] = []
        try:
            while len(seen) < limit:
                messages = await self._receive_dead(dlq, LIST_HIDE_S)
                if not messages:
                    break
                received.extend(messages)
                for message in messages:
                    seen.setdefault(str(message["MessageId"]), message)
        finally:
            await self._show(dlq, received)
        letters = [_letter(m) for m in seen.values()]
        letters.sort(key=lambda letter: (letter.sent_at_ms or 0, letter.id))
        return letters[:limit]

    async def redrive_dead(self, ids: Sequence[str] | None, revive: Revive) -> list[DeadLetter]:
        dlq = await self._dlq()
        wanted = None if ids is None else set(ids)
        moved: list[DeadLetter] = []
        passed: list[dict[str, Any]] = []
        done: set[str] = set()
        try:
            while wanted is None or not wanted <= done:
                messages = await self._receive_dead(dlq, MOVE_HIDE_S)
                if not messages:
                    break
                batch = []
                for message in messages:
                    message_id = str(message["MessageId"])
                    if message_id in done or (wanted is not None and message_id not in wanted):
                        passed.append(message)
                    else:
                        done.add(message_id)
                        batch.append(message)
                if batch:
                    moved.extend(await self._move(dlq, batch, revive))
        finally:
            await self._show(dlq, passed)
        return moved

    async def _move(
        self, dlq: str, messages: list[dict[str, Any]], revive: Revive
    ) -> list[DeadLetter]:
        letters = [_letter(m) for m in messages]
        await revive(letters)
        entries = [
            self._entry(str(i), letter.body, self.fifo, dedup=f"redrive:{letter.id}")
            for i, letter in enumerate(letters)
        ]
        await self._send_batches(self.queue_url, entries)
        handles = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        with self._mapped("delete from", dlq):
            await self.client.delete_message_batch(QueueUrl=dlq, Entries=handles)
        return letters

    async def purge_dead(self) -> int:
        dlq = await self._dlq()
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        with self._mapped("read the depth of", dlq):
            response = await self.client.get_queue_attributes(QueueUrl=dlq, AttributeNames=names)
        count = sum(int(response.get("Attributes", {}).get(n, 0)) for n in names)
        with self._mapped("purge", dlq):
            await self.client.purge_queue(QueueUrl=dlq)
        return count


def _letter(message: dict[str, Any]) -> DeadLetter:
    attributes = message.get("Attributes", {})
    reason = message.get("MessageAttributes", {}).get("reason", {}).get("StringValue")
    receives = int(attributes.get("ApproximateReceiveCount", 0))
    sent = attributes.get("SentTimestamp")
    return DeadLetter(
        str(message["MessageId"]),
        str(message.get("Body", "")),
        # One SQS moved itself after maxReceiveCount carries no reason of ours.
        str(reason) if reason else "moved by the queue's redrive policy",
        receives,
        int(sent) if sent else None,
    )

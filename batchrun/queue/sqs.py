"""The SQS retry queue over aioboto3: batches checked entry by entry, DLQ from the redrive policy.

Dead-lettering without a dead-letter queue: when the queue has no ``RedrivePolicy``,
``send_dead`` and ``dead_letter`` log each body and reason at ERROR and drop the message,
so the failure stays in the ledger (``batchrun status``) and in the logs, nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from batchrun.chunks import chunks
from batchrun.errors import QueueError
from batchrun.queue.base import Received
from batchrun.queue.sqs_dlq import SqsDeadLetters
from batchrun.queue.sqs_entries import (
    BATCH,
    MAX_DELAY_S,
    batches,
    delay_seconds,
    locate,
    visibility,
)
from batchrun.queue.sqs_entries import entry as batch_entry
from batchrun.queue.sqs_errors import ERRORS, STALE_RECEIPT, error_code, mapped, masked
from batchrun.urls import mask_url

log = logging.getLogger(__name__)

MAX_WAIT_S = 20  # SQS's longest long poll
SEND_ATTEMPTS = 4  # resends of entries a batch reported as Failed, with a short backoff
SEND_BACKOFF_S = 0.2
DEFAULT_MAX_RECEIVES = 5


class SqsQueue(SqsDeadLetters):
    """An SQS queue (FIFO when its name ends in ``.fifo``) and the DLQ its redrive names.

    Args:
        url: the queue URL, ``https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`` or
            ``http(s)://HOST:PORT/ACCOUNT/NAME`` for an emulator.
        env: the AWS variables (``Settings.extra``): region, endpoint, credentials.
        max_receives: deliveries before dead-lettering when the queue has no redrive
            policy; ``open()`` replaces it with the policy's ``maxReceiveCount``.
        concurrency: tasks that use the queue at once (sizes the connection pool).
        wait_s: long-poll time of ``receive``, 0-20 s.
    """

    def __init__(
        self,
        url: str,
        *,
        env: Mapping[str, str],
        max_receives: int = DEFAULT_MAX_RECEIVES,
        concurrency: int = 10,
        wait_s: float = 1.0,
    ) -> None:
        where = locate(url, env)
        self.queue_url = url
        self.url = mask_url(url)
        self.account, self.name = where.account, where.name
        self.fifo = self.name.endswith(".fifo")
        self.max_receives = max_receives
        self.wait_s = max(0, min(MAX_WAIT_S, round(wait_s)))
        self._env = env
        self.region = where.region
        self.endpoint = where.endpoint
        self._config = AioConfig(
            connect_timeout=3,
            read_timeout=self.wait_s + 10,  # a long poll holds the response for wait_s
            retries={"mode": "standard", "total_max_attempts": 3},
            max_pool_connections=max(10, concurrency),
        )
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._opened = False
        self.dlq_url: str | None = None
        self.dlq_fifo = False

    @property
    def client(self) -> Any:
        """The open aiobotocore client (for event hooks); ``open()`` first."""
        if self._client is None:
            raise QueueError(f"SQS queue {self.url} is not open")
        return self._client

    async def open(self) -> None:
        """Connect and read the redrive policy (DLQ, ``max_receives``); idempotent.

        Every operation calls it, so calling it yourself only moves errors (no credentials,
        no such queue) to a time of your choosing and makes ``max_receives`` final.
        """
        if self._opened:
            return
        async with self._lock:
            if self._opened:
                return
            if self._client is None:
                await self._connect()
            with self._mapped("read the attributes of"):
                response = await self._client.get_queue_attributes(
                    QueueUrl=self.queue_url, AttributeNames=["RedrivePolicy"]
                )
            policy_text = response.get("Attributes", {}).get("RedrivePolicy")
            if policy_text:
                await self._load_redrive(policy_text)
            self._opened = True

    async def check(self) -> None:
        """Ask SQS for the queue's attributes now (GetQueueAttributes), and the dead-letter
        queue's: both exist and take the credentials. The preflight of a run.

        Raises:
            QueueError: either queue is missing or unreachable, or the keys are refused.
        """
        await self.open()
        for url in (self.queue_url, self.dlq_url):
            if url is not None:
                with self._mapped("read the attributes of", url):
                    await self._client.get_queue_attributes(
                        QueueUrl=url, AttributeNames=["QueueArn"]
                    )

    async def _connect(self) -> None:
        stack = contextlib.AsyncExitStack()
        with self._mapped("connect to"):
            keys = self._env.get("AWS_ACCESS_KEY_ID"), self._env.get("AWS_SECRET_ACCESS_KEY")
            session = aioboto3.Session(
                aws_access_key_id=keys[0] or None,
                aws_secret_access_key=keys[1] or None,
                aws_session_token=self._env.get("AWS_SESSION_TOKEN") or None,
                region_name=self.region,
                profile_name=None if all(keys) else self._env.get("AWS_PROFILE") or None,
            )
            self._client = await stack.enter_async_context(
                session.client(
                    "sqs", region_name=self.region, endpoint_url=self.endpoint, config=self._config
                )
            )
        self._stack = stack

    async def _load_redrive(self, policy_text: str) -> None:
        try:
            policy = json.loads(policy_text)
            arn = str(policy["deadLetterTargetArn"])
            max_receives = int(policy["maxReceiveCount"])
        except (ValueError, KeyError, TypeError) as exc:
            raise QueueError(f"SQS queue {self.url} has an unreadable RedrivePolicy") from exc
        # arn:aws:sqs:REGION:ACCOUNT:NAME
        arn_parts = arn.split(":")
        if len(arn_parts) != 6:
            raise QueueError(f"SQS queue {self.url}: bad deadLetterTargetArn {arn!r}")
        account, name = arn_parts[4], arn_parts[5]
        with self._mapped(f"find the dead-letter queue {name} of"):
            response = await self._client.get_queue_url(
                QueueName=name, QueueOwnerAWSAccountId=account
            )
        self.dlq_url = str(response["QueueUrl"])
        self.dlq_fifo = name.endswith(".fifo")
        self.max_receives = max_receives

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        self._client = None
        self._opened = False
        if stack is not None:
            with contextlib.suppress(*ERRORS):
                await stack.aclose()

    # -- sending ---------------------------------------------------------------------------

    async def send(self, bodies: Sequence[str], *, delay_s: float = 0.0) -> None:
        if bodies:
            await self.open()
            call = uuid.uuid4().hex
            entries = [
                self._entry(str(i), body, self.fifo, call=call) for i, body in enumerate(bodies)
            ]
            delay = delay_seconds(delay_s)
            if delay and not self.fifo:  # a FIFO queue refuses a per-message delay
                for entry in entries:
                    entry["DelaySeconds"] = delay
            elif delay:
                log.debug("SQS %s is FIFO: the %d s delay is left to the consumer", self.url, delay)
            await self._send_batches(self.queue_url, entries)

    async def send_dead(self, bodies: Sequence[tuple[str, str]]) -> None:
        if not bodies:
            return
        await self.open()
        if self.dlq_url is None:
            for body, reason in bodies:
                log.error("no dead-letter queue for %s; dropped %s: %s", self.url, body, reason)
            return
        call = uuid.uuid4().hex
        entries = [
            self._entry(str(i), body, self.dlq_fifo, reason=reason, call=call)
            for i, (body, reason) in enumerate(bodies)
        ]
        await self._send_batches(self.dlq_url, entries)

    def _entry(
        self,
        entry_id: str,
        body: str,
        fifo: bool,
        *,
        reason: str = "",
        dedup: str = "",
        call: str = "",
    ) -> dict[str, Any]:
        """One batch entry (``sqs_entries.entry``)."""
        return batch_entry(entry_id, body, fifo, reason=reason, dedup=dedup, call=call)

    async def _send_batches(self, queue_url: str, entries: list[dict[str, Any]]) -> None:
        """Send every entry; resend those a batch reports Failed; raise if any never made it."""
        pending = entries
        failures: dict[str, dict[str, Any]] = {}
        sent: set[str] = set()  # the ids SQS said it queued
        for attempt in range(SEND_ATTEMPTS):
            if attempt:
                await asyncio.sleep(SEND_BACKOFF_S * 2 ** (attempt - 1))
            failures = {}
            for batch in batches(pending):
                try:
                    with self._mapped("send to", queue_url):
                        # A copy: event handlers may rewrite the request's list in place.
                        response = await self._client.send_message_batch(
                            QueueUrl=queue_url, Entries=list(batch)
                        )
                except QueueError as exc:
                    exc.unsent = _unsent(entries, sent)  # earlier calls' entries did go
                    raise
                ok = {item["Id"] for item in response.get("Successful", [])}
                sent |= ok
                reported = {item["Id"]: item for item in response.get("Failed", [])}
                for entry in batch:
                    if entry["Id"] not in ok:
                        failures[entry["Id"]] = reported.get(entry["Id"], {"Code": "missing"})
            # A sender fault (bad body, bad attribute) fails the same way every time.
            retryable = [e for e in pending if e["Id"] in failures]
            if not retryable or any(f.get("SenderFault") for f in failures.values()):
                break
            log.warning(
                "SQS %s: %d of %d entries failed, resending",
                mask_url(queue_url),
                len(retryable),
                len(pending),
            )
            pending = retryable
        if failures:
            first = next(iter(failures.values()))
            error = QueueError(
                self._mask(
                    f"SQS {mask_url(queue_url)}: {len(failures)} of {len(entries)} messages "
                    f"not queued ({first.get('Code')}: {first.get('Message', '')})"
                )
            )
            error.unsent = _unsent(entries, sent)
            raise error

    # -- receiving -------------------------------------------------------------------------

    async def receive(self, *, max_messages: int, visibility_s: float) -> list[Received]:
        if max_messages <= 0:
            return []
        await self.open()
        with self._mapped("receive from"):
            response = await self._client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(BATCH, max_messages),
                VisibilityTimeout=visibility(visibility_s),
                WaitTimeSeconds=self.wait_s,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        return [
            Received(
                str(m["MessageId"]),
                str(m["ReceiptHandle"]),
                str(m.get("Body", "")),
                int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
            )
            for m in response.get("Messages", [])
        ]

    async def delete(self, items: Sequence[Received]) -> None:
        if not items:
            return
        await self.open()
        for chunk in chunks(items, BATCH):
            entries = [{"Id": str(i), "ReceiptHandle": it.receipt} for i, it in enumerate(chunk)]
            with self._mapped("delete from"):
                response = await self._client.delete_message_batch(
                    QueueUrl=self.queue_url, Entries=entries
                )
            # A failed delete is not lost work: the message comes back after its visibility
            # timeout and the job's idempotency turns the repeat into a no-op.
            for failed in response.get("Failed", []):
                log.warning(
                    "SQS %s: could not delete message %s (%s: %s); it will come back",
                    self.url,
                    chunk[int(failed["Id"])].message_id,
                    failed.get("Code"),
                    failed.get("Message", ""),
                )

    async def retry_later(self, item: Received, delay_s: float) -> None:
        await self.open()
        try:
            with self._mapped("change visibility in"):
                await self._client.change_message_visibility(
                    QueueUrl=self.queue_url,
                    ReceiptHandle=item.receipt,
                    VisibilityTimeout=visibility(delay_s),
                )
        except QueueError as exc:
            if error_code(exc.__cause__) not in STALE_RECEIPT:
                raise
            log.warning("SQS %s: message %s is no longer ours: %s", self.url, item.message_id, exc)

    async def dead_letter(self, item: Received, reason: str) -> None:
        await self.open()
        if self.dlq_url is None:
            log.error(
                "no dead-letter queue for %s; deleted message %s (%s): %s",
                self.url,
                item.message_id,
                reason,
                item.body,
            )
        else:
            # Dedup on the message id: a message dead-lettered twice (its delete failed and it
            # came back) lands once on a FIFO DLQ.
            entry = self._entry(
                "0", item.body, self.dlq_fifo, reason=reason, dedup=f"dead:{item.message_id}"
            )
            await self._send_batches(self.dlq_url, [entry])
        await self.delete([item])

    async def depths(self) -> tuple[int, int | None]:
        await self.open()
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        with self._mapped("read the depth of"):
            response = await self._client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=names
            )
        attributes = response.get("Attributes", {})
        depth = sum(int(attributes.get(name, 0)) for name in names)
        if self.dlq_url is None:
            return depth, None
        with self._mapped("read the depth of", self.dlq_url):
            response = await self._client.get_queue_attributes(
                QueueUrl=self.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
            )
        return depth, int(response.get("Attributes", {}).get("ApproximateNumberOfMessages", 0))

    async def next_due_s(self) -> float | None:
        """SQS tells how many messages are delayed or in flight, not when they return."""
        return None

    # -- errors ----------------------------------------------------------------------------

    def _mapped(
        self, action: str, queue_url: str | None = None
    ) -> contextlib.AbstractContextManager[None]:
        return mapped(action, queue_url or self.queue_url, self._env)

    def _mask(self, text: str) -> str:
        return masked(text, self._env)


def _unsent(entries: list[dict[str, Any]], sent: set[str]) -> tuple[int, ...]:
    """The positions of the entries SQS did not say it queued."""
    return tuple(i for i, entry in enumerate(entries) if entry["Id"] not in sent)


__all__ = ["MAX_DELAY_S", "SqsQueue", "delay_seconds"]

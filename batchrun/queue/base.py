"""The retry-queue protocol, its message bodies, and backend choice by URL."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard

from batchrun import schemes
from batchrun.db.store import MAX_ID
from batchrun.errors import ConfigError
from batchrun.job import NAME
from batchrun.period import Unit
from batchrun.period import parse as parse_period
from batchrun.urls import mask_url, scheme_of

if TYPE_CHECKING:
    from batchrun.db.base import Database

MAX_BODY = 64 * 1024  # SQS's own limit is 256 KiB; ours are a few hundred bytes
KINDS = ("retry", "task", "continuation", "shard", "entity_task")
Kind = Literal["retry", "task", "continuation", "shard", "entity_task"]
TASK_KEY_MAX = 200


class PoisonMessage(ValueError):
    """A queue message that can never be processed; carries the reason."""


class UnknownFormat(PoisonMessage):
    """A message of a newer format than this batchrun reads (``"v": 3``): it stays on the
    queue for a process that reads it, as a message for an unknown job does."""

    def __init__(self, version: int) -> None:
        super().__init__(f"message format v{version}, newer than this batchrun reads (v1, v2)")
        self.version = version


class UnknownJob(PoisonMessage):
    """A well-formed message for a job this process does not know (``--jobs`` left it
    out): not poison for a process that knows the job, so it stays on the queue."""

    def __init__(self, job: str) -> None:
        super().__init__(f"unknown job {job!r}")
        self.job = job


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """One entity's task, or a range of a period's entities: ids in (after_id, until_id].

    A ``retry`` redoes an entity that failed; a ``task`` is one an application submitted
    (``batchrun submit --period``); an ``entity_task`` is one submitted to a
    ``batchrun.Task`` job, named by its ``key`` (its data waits in the database). A
    ``shard`` is a range the fan-out producer queued; a ``continuation`` is the rest of a
    range (or period) that a stopped run handed on, with what is left of its ``--limit``.
    Ranges are worked the same way.

    Bodies of batchrun 0.1 (``"v": 1``, ``month`` and ``user_id``) are read as well.
    """

    kind: Kind
    job: str
    period: str
    entity_id: int = 0
    after_id: int = 0
    until_id: int = MAX_ID
    attempt: int = 0
    reason: str = ""
    limit: int | None = None
    key: str = ""  # an entity_task's
    # times in a row a consumer gave this entity (or task) back because its backend was
    # busy: the next give-back waits longer (``policy.busy.busy_delay_s``)
    busy: int = 0
    # an entity_task sent again because its first message looked lost (tasks/resend.py):
    # on a FIFO queue it goes in a group of its own, not behind the messages waiting for it
    resent: bool = False

    def to_json(self) -> str:
        busy = {"busy": self.busy} if self.busy else {}
        if self.kind == "entity_task":
            task = {"v": 2, "kind": self.kind, "job": self.job, "id": self.entity_id}
            resent = {"resent": 1} if self.resent else {}
            return json.dumps({**task, "key": self.key, **busy, **resent}, separators=(",", ":"))
        body: dict[str, Any] = {"v": 2, "kind": self.kind, "job": self.job, "period": self.period}
        if self.kind in ("retry", "task"):
            body.update(id=self.entity_id, attempt=self.attempt, reason=self.reason[:300])
            body.update(busy)
        else:
            body.update(after_id=self.after_id)
            if self.until_id != MAX_ID:
                body.update(until_id=self.until_id)
            if self.limit is not None:
                body.update(limit=self.limit)
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, units: Mapping[str, Unit]) -> QueueMessage:
        """Parse and validate a body for the jobs ``units`` names (job -> period unit);
        raise PoisonMessage for anything malformed, UnknownJob (a PoisonMessage) for a job
        that is not registered."""
        if len(text) > MAX_BODY:
            raise PoisonMessage(f"body too large ({len(text)} bytes)")
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise PoisonMessage(f"not JSON: {exc}") from None
        except RecursionError:
            raise PoisonMessage("JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise PoisonMessage("body is not a JSON object")
        version = body.get("v", 2)
        if not _is_int(version) or version < 1:
            raise PoisonMessage(f"bad message format {str(version)[:20]!r}")
        if version > 2:
            # A newer batchrun's (a rolling upgrade): never read as if it were this one's,
            # and not poison to the process that wrote it.
            raise UnknownFormat(version)
        kind = body.get("kind")
        if kind not in KINDS:
            raise PoisonMessage(f"unknown kind {kind!r}")
        job = body.get("job")
        if not isinstance(job, str) or not NAME.fullmatch(job):
            raise PoisonMessage(f"unknown job {job!r}")
        if job not in units:
            raise UnknownJob(job)
        busy = body.get("busy", 0)
        if not _is_int(busy) or not 0 <= busy <= MAX_ID:
            raise PoisonMessage(f"bad busy {busy!r}")
        if kind == "entity_task":
            return replace(cls._entity_task(job, body), busy=busy)
        period = body.get("period", body.get("month"))
        try:
            if not isinstance(period, str):
                raise ValueError
            period = str(parse_period(units[job], period))
        except ValueError:
            raise PoisonMessage(f"bad period {period!r}") from None
        if kind in ("retry", "task"):
            entity_id = body.get("id", body.get("user_id"))
            attempt = body.get("attempt", 0)
            if not _is_int(entity_id) or not 0 < entity_id <= MAX_ID:
                raise PoisonMessage(f"bad id {entity_id!r}")
            if not _is_int(attempt) or not 0 <= attempt <= MAX_ID:
                raise PoisonMessage(f"bad attempt {attempt!r}")
            reason = body.get("reason", "")
            return cls(
                kind,
                job,
                period,
                entity_id=entity_id,
                attempt=attempt,
                reason=reason if isinstance(reason, str) else "",
                busy=busy,
            )
        after_id = body.get("after_id")
        until_id = body.get("until_id", MAX_ID)
        limit = body.get("limit")
        if not _is_int(after_id) or not 0 <= after_id <= MAX_ID:
            raise PoisonMessage(f"bad after_id {after_id!r}")
        if not _is_int(until_id) or not after_id < until_id <= MAX_ID:
            raise PoisonMessage(f"bad until_id {until_id!r}")
        if limit is not None and (not _is_int(limit) or limit < 1):
            raise PoisonMessage(f"bad limit {limit!r}")
        return cls(kind, job, period, after_id=after_id, until_id=until_id, limit=limit)

    @classmethod
    def _entity_task(cls, job: str, body: dict[str, Any]) -> QueueMessage:
        entity_id, key = body.get("id"), body.get("key")
        if not _is_int(entity_id) or not 0 < entity_id <= MAX_ID:
            raise PoisonMessage(f"bad id {entity_id!r}")
        if not isinstance(key, str) or not 0 < len(key) <= TASK_KEY_MAX:
            raise PoisonMessage("bad task key")
        resent = body.get("resent", 0) == 1
        return cls("entity_task", job, "", entity_id=entity_id, key=key, resent=resent)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Received:
    """A message as received: its id, the handle to act on it, its body and deliveries."""

    message_id: str
    receipt: str
    body: str
    receive_count: int


class WorkQueue(Protocol):
    """The queue the road's work travels on (retries, submitted tasks, continuations and
    shards), with SQS semantics: visibility timeout, receive count, dead-letter queue."""

    url: str  # masked: safe to print
    max_receives: int

    async def open(self) -> None:
        """Connect and read the queue's settings (e.g. its redrive policy); idempotent."""
        ...

    async def check(self) -> None:
        """Make sure the queue (and its dead-letter queue) can be used now, writing nothing;
        raise QueueError with the cause. A run calls it before any effect."""
        ...

    async def send(self, bodies: Sequence[str], *, delay_s: float = 0.0) -> None:
        """Queue every body, visible after ``delay_s`` (at once by default); raise
        QueueError if any was not queued. SQS caps a delay at 15 minutes (``MAX_DELAY_S``)
        and a FIFO queue takes none: there the consumer's own backoff is what holds."""
        ...

    async def send_dead(self, bodies: Sequence[tuple[str, str]]) -> None:
        """Put (body, reason) pairs straight on the dead-letter queue (permanent failures)."""
        ...

    async def receive(self, *, max_messages: int, visibility_s: float) -> list[Received]:
        """Receive up to ``max_messages`` visible messages, hiding them for ``visibility_s``."""
        ...

    async def delete(self, items: Sequence[Received]) -> None: ...

    async def retry_later(self, item: Received, delay_s: float) -> None:
        """Hide ``item`` for ``delay_s`` (a backoff) instead of deleting it."""
        ...

    async def dead_letter(self, item: Received, reason: str) -> None: ...

    async def keep(self, item: Received, delay_s: float) -> None:
        """Leave ``item`` on the queue for another process (hidden for ``delay_s``), its
        receives never reaching the dead-letter limit (an SQS queue re-sends a copy)."""
        ...

    async def give_back(self, item: Received, body: str, delay_s: float) -> bool:
        """Put ``item`` back for a later delivery as if it were new (its backend was busy):
        with ``body``, after ``delay_s``, its receives starting again, so they never reach
        the dead-letter limit. True when a fresh copy was queued and ``item`` is the
        caller's to delete; False when ``item`` itself waits (the local table's row, or a
        FIFO queue's message, hidden for the delay: FIFO takes no per-message delay)."""
        ...

    async def depths(self) -> tuple[int, int | None]:
        """(messages waiting or in flight, dead-letter depth or None if there is no DLQ)."""
        ...

    async def next_due_s(self) -> float | None:
        """Seconds until the next message not visible now becomes visible (its retry's
        backoff ends, or another consumer's hold on it); None when none waits, or the
        queue cannot tell (SQS)."""
        ...

    async def close(self) -> None: ...


def backoff_s(receive_count: int, *, base_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter in its upper half, for the n-th failed receive."""
    ceiling = min(max_s, base_s * 2 ** max(0, receive_count - 1))
    return float(ceiling * random.uniform(0.5, 1.0))


def from_url(
    url: str | None,
    *,
    db: Database,
    max_receives: int,
    env: Mapping[str, str] | None = None,
    concurrency: int = 10,
) -> WorkQueue:
    """The queue named by ``url``; None means the table in the ``--db`` database.

    Args:
        url: an SQS queue URL, or None/"" for the queue table in ``db``.
        db: the job's database (the default queue lives there).
        max_receives: deliveries before dead-lettering; an SQS queue's redrive policy wins.
        env: the AWS variables (``Settings.extra``) an SQS queue reads its region,
            endpoint and credentials from.
        concurrency: tasks that use the queue at once (sizes the SQS connection pool).
    """
    if url is None or url in LOCAL_URLS:
        from batchrun.queue.local import LocalQueue

        return LocalQueue(db, max_receives=max_receives)
    check_url(url)
    try:
        from batchrun.queue.sqs import SqsQueue
    except ImportError as exc:
        raise ConfigError(
            f"SQS retry queues need aioboto3 ({exc.name} is missing): pip install 'batchrun[aws]'"
        ) from None
    return SqsQueue(url, env=env or {}, max_receives=max_receives, concurrency=concurrency)


LOCAL_URLS = ("", "local", "db")  # the queue table in the --db database


def check_url(url: str | None) -> None:
    """Raise ConfigError unless ``url`` names a retry queue batchrun can open (None or
    ``LOCAL_URLS``: the table in the --db database; an SQS queue URL)."""
    if url is None or url in LOCAL_URLS or schemes.find("queue", url) is not None:
        return
    if scheme_of(url) == "sqs":
        raise ConfigError(
            f"retry queue {mask_url(url)!r}: give the queue's URL, "
            "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"
        )
    raise ConfigError(
        f"unknown retry queue URL {mask_url(url)!r}: use an SQS queue URL, or leave it unset "
        "for the queue table in the --db database"
    )

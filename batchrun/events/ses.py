"""Bounces and complaints: SES event notifications read from an SQS queue, applied.

SES reports what became of a message through SNS (an identity's feedback notifications,
``notificationType``) or a configuration set's event destination (``eventType``); the
SNS topic delivers either to an SQS queue, wrapped in SNS's envelope (``"Type":
"Notification"``, the event as the JSON string ``Message``) or raw (raw message delivery).
``parse`` reads all four shapes:

- a permanent bounce or a complaint: each recipient goes on the suppression list (reason
  ``bounce`` or ``complaint``, source the SES message id) and the entity's ledger row gets
  ``mail_event`` set, the entity found through ``X-Batchrun-Id`` in the original headers
  (or the Message-ID batchrun gave the email, which SES keeps in ``commonHeaders``);
- a transient or undetermined bounce, a delivery, an open, a click, any other SES event
  type, SNS's subscription confirmations: ignored, nothing changes;
- anything else (not JSON, an unknown shape or event type, a bounce naming no recipient,
  a recipient that is no address batchrun could have mailed, an ``X-Batchrun-Id`` naming
  an id no ledger row can have, an SNS envelope from another topic than
  ``BATCHRUN_EVENTS_TOPIC``): ``PoisonEvent``. ``drain`` dead-letters it at once, as
  ``batchrun retry`` does poison, and goes on; the Lambda reports it failed so the
  queue's redrive policy moves it.

Each message stands alone: one that is poison, or whose database write fails, never keeps
the others of its batch from being applied. Addresses are stored in their one key
(``batchrun.mail.address.address_key``), so a bounce for ``jo@xn--bcher-kva.example``
suppresses ``jo@bücher.example``. Applying an event twice changes nothing more (SQS
delivers at least once).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from email.utils import parseaddr
from typing import Any, Literal

from batchrun.db.store import MAX_ID, MAX_SOURCE_CHARS, Store, address_key, storable_key
from batchrun.errors import DatabaseError
from batchrun.mail.message import clean_text, valid_address
from batchrun.pipeline.engine import StopToken
from batchrun.queue.base import MAX_BODY, Received, WorkQueue

log = logging.getLogger(__name__)

Kind = Literal["bounce", "complaint", "ignored"]
VISIBILITY_S = 60.0  # a received batch is applied in well under this
SNS_TYPES = frozenset({"Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"})
# SES event types that change nothing here (event publishing and notifications alike).
IGNORED_TYPES = frozenset(
    {
        "Delivery",
        "Send",
        "Reject",
        "Open",
        "Click",
        "Rendering Failure",
        "RenderingFailure",
        "DeliveryDelay",
        "Subscription",
        "AmazonSnsSubscriptionSucceeded",
    }
)
# The Message-ID (and X-Batchrun-Id) batchrun gives an email: "<job.once_key.id@domain>".
_BATCHRUN_ID = re.compile(r"^\s*<([a-z][a-z0-9_-]{0,31})\.([0-9A-Za-z-]{1,32})\.([0-9]{1,19})@")


class PoisonEvent(ValueError):
    """A queue message that is no SES event batchrun can read; carries the reason."""


@dataclass(frozen=True, slots=True)
class Entity:
    """The ledger row an email belongs to."""

    job: str
    once: str
    entity_id: int


@dataclass(frozen=True, slots=True)
class MailEvent:
    """One SES event, as much of it as batchrun acts on."""

    kind: Kind
    detail: str  # "Permanent/General", "Transient/MailboxFull", "abuse", "Delivery" ...
    ses_message_id: str = ""
    addresses: tuple[str, ...] = ()
    entity: Entity | None = None


@dataclass
class EventsSummary:
    """What a drain of the events queue did, in messages (``suppressed``: addresses)."""

    read: int = 0
    bounces: int = 0  # permanent bounces
    complaints: int = 0
    suppressed: int = 0  # addresses put on the suppression list (not already on it)
    recorded: int = 0  # ledger rows that gained a bounce or complaint
    ignored: int = 0
    poison: int = 0  # dead-lettered
    failed: int = 0  # not applied (the database failed): left on the queue for later
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 when every message was applied or dead-lettered as poison; 1 when the
        database failed on some (they stay on the queue: nothing lost)."""
        return 1 if self.failed else 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration_s"] = round(self.duration_s, 3)
        return data


def looks_like(body: str) -> bool:
    """Whether a queue message body is shaped like an SES or SNS notification (the Lambda
    sends those to ``apply``, the rest to the retry path)."""
    if not body.lstrip().startswith("{") or len(body) > MAX_BODY * 4:
        return False
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return False
    if not isinstance(data, dict):
        return False
    if data.get("Type") in SNS_TYPES and "TopicArn" in data:
        return True
    return "notificationType" in data or "eventType" in data


def parse(body: str, *, topic: str = "") -> MailEvent:
    """The SES event in a queue message body (SNS-wrapped or raw); raise PoisonEvent.

    ``topic``: when given, the only SNS topic ARN whose notifications are taken (a body
    without SNS's envelope is refused then too: nothing says where it came from).
    """
    data = _object(body, "body")
    if topic and data.get("TopicArn") != topic:
        shown = clean_text(str(data.get("TopicArn", "no TopicArn")), 120)
        raise PoisonEvent(f"not from the SNS topic BATCHRUN_EVENTS_TOPIC names ({shown!r})")
    if "Type" in data and "TopicArn" in data:
        kind = data.get("Type")
        if kind in ("SubscriptionConfirmation", "UnsubscribeConfirmation"):
            # An SQS subscription confirms itself; the message is only news.
            return MailEvent("ignored", f"SNS {kind}")
        if kind != "Notification":
            raise PoisonEvent(f"unknown SNS message type {kind!r}")
        message = data.get("Message")
        if not isinstance(message, str):
            raise PoisonEvent("SNS notification without a Message string")
        data = _object(message, "SNS Message")
    return _event(data)


def _object(text: str, what: str) -> dict[str, Any]:
    if len(text) > MAX_BODY * 4:  # SQS's own limit is 256 KiB
        raise PoisonEvent(f"{what} too large ({len(text)} bytes)")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PoisonEvent(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise PoisonEvent(f"{what}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise PoisonEvent(f"{what} is not a JSON object")
    return data


def _event(data: Mapping[str, Any]) -> MailEvent:
    kind = data.get("eventType", data.get("notificationType"))
    if not isinstance(kind, str):
        raise PoisonEvent("not an SES event (no eventType nor notificationType)")
    if kind in IGNORED_TYPES:
        return MailEvent("ignored", kind, _message_id(data))
    if kind == "Bounce":
        bounce = _part(data, "bounce")
        detail = f"{bounce.get('bounceType')}/{bounce.get('bounceSubType')}"
        if bounce.get("bounceType") != "Permanent":
            return MailEvent("ignored", detail, _message_id(data))
        recipients = bounce.get("bouncedRecipients")
        return _acting("bounce", detail, data, recipients)
    if kind == "Complaint":
        complaint = _part(data, "complaint")
        detail = str(complaint.get("complaintFeedbackType") or "complaint")
        return _acting("complaint", detail, data, complaint.get("complainedRecipients"))
    raise PoisonEvent(f"unknown SES event type {kind[:40]!r}")


def _part(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    part = data.get(name)
    if not isinstance(part, dict):
        raise PoisonEvent(f"SES {name} event without its {name!r} object")
    return part


def _acting(kind: Kind, detail: str, data: Mapping[str, Any], recipients: Any) -> MailEvent:
    if not isinstance(recipients, list) or not recipients:
        raise PoisonEvent(f"SES {kind} names no recipient")
    addresses: list[str] = []
    for recipient in recipients:
        text = recipient.get("emailAddress") if isinstance(recipient, dict) else None
        address = parseaddr(text)[1] if isinstance(text, str) else ""
        if isinstance(text, str) and clean_text(text) != text.strip():
            address = ""  # a control character, NUL or lone surrogate: never parsed around
        # What batchrun could have mailed, and what the suppression list can hold: no
        # control character, NUL or lone surrogate, a domain IDNA can write.
        if not valid_address(address) or not storable_key(address_key(address)):
            shown = ascii(str(text)[:80])
            raise PoisonEvent(f"SES {kind} recipient is not an address: {shown}")
        addresses.append(address)
    return MailEvent(kind, detail, _message_id(data), tuple(addresses), _entity(data))


def _message_id(data: Mapping[str, Any]) -> str:
    mail = data.get("mail")
    value = mail.get("messageId") if isinstance(mail, dict) else None
    if not isinstance(value, str):
        return ""
    value = value[:MAX_SOURCE_CHARS]
    if clean_text(value) != value:  # stored as the suppression's source
        raise PoisonEvent(f"SES messageId holds a control character: {value[:80]!a}")
    return value


def _entity(data: Mapping[str, Any]) -> Entity | None:
    """The entity batchrun sent the email for: X-Batchrun-Id, else its Message-ID."""
    mail = data.get("mail")
    if not isinstance(mail, dict):
        return None
    candidates: list[object] = []
    headers = mail.get("headers")
    if isinstance(headers, list):
        candidates += [
            h.get("value")
            for h in headers
            if isinstance(h, dict) and str(h.get("name", "")).lower() == "x-batchrun-id"
        ]
    common = mail.get("commonHeaders")
    if isinstance(common, dict):
        candidates.append(common.get("messageId"))
    for value in candidates:
        match = _BATCHRUN_ID.match(value) if isinstance(value, str) else None
        if match:
            entity_id = int(match[3])
            if entity_id > MAX_ID:
                raise PoisonEvent(f"X-Batchrun-Id names an id out of range: {match[3]}")
            return Entity(match[1], match[2], entity_id)
    return None


async def apply(store: Store, event: MailEvent, summary: EventsSummary) -> None:
    """Suppress a bounce's or complaint's addresses and note it on the ledger row."""
    if event.kind == "ignored":
        summary.ignored += 1
        log.debug("ignored SES event %s (%s)", event.ses_message_id, event.detail)
        return
    # Counted once the whole event is applied: a failed one is counted failed alone.
    suppressed = recorded = 0
    for address in event.addresses:
        if await store.suppress(address, reason=event.kind, source=event.ses_message_id):
            suppressed += 1
            log.info("suppressed %s (%s %s)", address, event.kind, event.detail)
    if event.entity is not None:
        entity = event.entity
        if await store.record_mail_event(
            job=entity.job, once=entity.once, entity_id=entity.entity_id, event=event.kind
        ):
            recorded += 1
    if event.kind == "bounce":
        summary.bounces += 1
    else:
        summary.complaints += 1
    summary.suppressed += suppressed
    summary.recorded += recorded


@dataclass
class Applied:
    """What became of a batch of received event messages, each on its own."""

    done: list[Received]  # applied (or ignored): delete them
    poison: list[tuple[Received, str]]  # with the reason: dead-letter them
    failed: list[tuple[Received, str]]  # the database failed: leave them for later


async def apply_items(
    store: Store, items: Sequence[Received], summary: EventsSummary, *, topic: str = ""
) -> Applied:
    """Apply received event messages, each alone: one that is poison or whose write fails
    never stops the rest. ``topic``: as for ``parse``."""
    applied = Applied([], [], [])
    for item in items:
        summary.read += 1
        try:
            event = parse(item.body, topic=topic)
            await apply(store, event, summary)
        except (PoisonEvent, ValueError) as exc:  # store.suppress refuses a bad key too
            log.error("poison event message %s: %s", item.message_id, exc)
            summary.poison += 1
            applied.poison.append((item, f"poison: {exc}"))
            continue
        except DatabaseError as exc:
            # The database, or this one message's values: either way the message stays
            # on the queue; after its maximum receives the redrive policy moves it.
            log.error("event message %s not applied: %s", item.message_id, exc)
            summary.failed += 1
            applied.failed.append((item, str(exc)))
            continue
        applied.done.append(item)
    return applied


async def drain(
    queue: WorkQueue,
    store: Store,
    *,
    max_messages: int = 10_000,
    stop: StopToken | None = None,
    topic: str = "",
) -> EventsSummary:
    """Read the events queue until it is empty (or ``max_messages``), applying each event;
    delete what was applied, dead-letter poison at once. ``topic``: as for ``parse``."""
    summary = EventsSummary()
    while summary.read < max_messages and not (stop is not None and stop.stopping):
        items = await queue.receive(
            max_messages=min(10, max_messages - summary.read), visibility_s=VISIBILITY_S
        )
        if not items:
            break
        applied = await apply_items(store, items, summary, topic=topic)
        try:
            for item, reason in applied.poison:
                await queue.dead_letter(item, reason)
        finally:
            # What was applied goes even if a dead-lettering failed (the rest comes back).
            await queue.delete(applied.done)
    return summary


__all__ = [
    "Applied",
    "Entity",
    "EventsSummary",
    "MailEvent",
    "PoisonEvent",
    "apply",
    "apply_items",
    "drain",
    "looks_like",
    "parse",
]

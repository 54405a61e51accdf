"""A capturing mailer: every message a job sends, as the test reads it, and injected failures.

``Mailbox`` is a real ``Mailer``: the runtime hands it the same ``Message`` it would hand
SMTP or SES, and the mailbox keeps the message's wire bytes parsed back, so a test sees
the headers (``Message-ID``, ``List-Unsubscribe`` ...) and the decoded text and HTML
exactly as a recipient would.
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Literal

from batchrun.errors import MailConnectionError, PermanentMailError, TemporaryMailError
from batchrun.mail.message import Message

FailureKind = Literal["temporary", "permanent", "outage"]
KINDS: tuple[FailureKind, ...] = ("temporary", "permanent", "outage")


class Headers(Mapping[str, str]):
    """A message's header fields, looked up case-insensitively; values decoded (RFC 2047)."""

    def __init__(self, fields: Iterable[tuple[str, str]]) -> None:
        self._fields = [(name, str(value)) for name, value in fields]

    def __getitem__(self, name: str) -> str:
        wanted = name.lower()
        for key, value in self._fields:
            if key.lower() == wanted:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(name for name, _ in self._fields))

    def __len__(self) -> int:
        return len(dict.fromkeys(name.lower() for name, _ in self._fields))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(k.lower() == name.lower() for k, _ in self._fields)

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


@dataclass(frozen=True)
class Email:
    """One message a job sent (or would send, from ``preview``), as the recipient reads it.

    Attributes:
        to: the recipient's address, as the job gave it.
        to_name: the recipient's display name ("" when none).
        sender: the From header (``Job.sender``, ``--from`` or ``{job}@localhost``).
        subject: the decoded subject.
        text: the text part, decoded.
        html: the HTML part, decoded; None for a text-only message.
        headers: every header field, case-insensitive (``headers["list-unsubscribe"]``).
        message_id: the stable Message-ID derived from the entity's key.
        raw: the message's bytes as a mail server would receive them.
    """

    to: str
    to_name: str
    sender: str
    subject: str
    text: str
    html: str | None
    headers: Headers = field(repr=False)
    message_id: str
    raw: bytes = field(repr=False)

    @classmethod
    def from_message(cls, message: Message) -> Email:
        """The ``Email`` a recipient of ``message`` reads: its wire bytes parsed back."""
        utf8 = not message.to_addr.isascii()  # a non-ASCII local part needs SMTPUTF8
        raw = message.to_bytes(utf8=utf8)
        parsed = (
            email.message_from_string(raw.decode("utf-8"), policy=email.policy.SMTPUTF8)
            if utf8
            else email.message_from_bytes(raw, policy=email.policy.SMTP)
        )
        assert isinstance(parsed, EmailMessage)
        text = parsed.get_body(("plain",))
        html = parsed.get_body(("html",))
        return cls(
            to=message.to_addr,
            to_name=message.to_name,
            sender=str(parsed["From"]),
            subject=str(parsed["Subject"]),
            # The wire's CRLF line ends read back as the "\n" the job wrote.
            text=_lines(text.get_content()) if text is not None else "",
            html=_lines(html.get_content()) if html is not None else None,
            headers=Headers(parsed.items()),
            message_id=message.message_id,
            raw=raw,
        )


def _lines(content: object) -> str:
    return str(content).replace("\r\n", "\n")


@dataclass
class _Rule:
    kind: FailureKind
    to: frozenset[str] | None  # None: every recipient
    times: int | None  # None: every send
    reason: str


class Mailbox:
    """A ``Mailer`` that keeps what it is sent, and fails on request.

    ``messages`` are the emails accepted, in order; ``attempts`` every recipient a send
    was tried for, failed ones included. ``fail`` injects failures the way real backends
    fail, so the runtime classifies them as it would an SMTP server's:

    - ``"temporary"`` (SMTP 451): the entity is queued for retry (``retry`` redoes it);
    - ``"permanent"`` (SMTP 550): the entity fails for good and is dead-lettered;
    - ``"outage"`` (connection refused): every recipient; the circuit breaker opens after
      a few in a row, and the run queues the rest for retry.
    """

    def __init__(self) -> None:
        self.messages: list[Email] = []
        self.attempts: list[str] = []
        self._rules: list[_Rule] = []
        self.closed = False

    def fail(
        self,
        kind: FailureKind,
        *,
        to: str | Iterable[str] | None = None,
        times: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Make sends fail from now on.

        Args:
            kind: ``"temporary"``, ``"permanent"`` or ``"outage"``.
            to: the recipient(s) it applies to; None: every recipient (an outage always
                is for every recipient).
            times: how many sends fail before they succeed again; None: until ``recover``.
            reason: the server's text (the default names the kind, e.g. ``451 4.3.0 try
                again later``); it ends up in the ledger's reason.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1, got {times}")
        if kind == "outage" and to is not None:
            raise ValueError("an outage is for every recipient: leave to= out")
        recipients = None if to is None else frozenset([to] if isinstance(to, str) else to)
        default = {
            "temporary": "451 4.3.0 try again later",
            "permanent": "550 5.1.1 no such mailbox",
            "outage": "connection refused",
        }[kind]
        self._rules.append(_Rule(kind, recipients, times, reason or default))

    def recover(self) -> None:
        """Stop every injected failure: sends succeed again."""
        self._rules.clear()

    def clear(self) -> None:
        """Forget the messages and attempts so far (injected failures stay)."""
        self.messages.clear()
        self.attempts.clear()

    def to(self, address: str) -> list[Email]:
        """The messages sent to ``address``."""
        return [m for m in self.messages if m.to == address]

    # -- the Mailer protocol ------------------------------------------------------------

    async def send(self, message: Message) -> None:
        self.attempts.append(message.to_addr)
        for rule in self._rules:
            if rule.to is not None and message.to_addr not in rule.to:
                continue
            if rule.times is not None:
                if rule.times == 0:
                    continue
                rule.times -= 1
            if rule.kind == "temporary":
                raise TemporaryMailError(f"{rule.reason} (injected)")
            if rule.kind == "permanent":
                raise PermanentMailError(f"{rule.reason} (injected)")
            raise MailConnectionError(f"{rule.reason} (injected outage)")
        self.messages.append(Email.from_message(message))

    async def check(self) -> None:
        """The mailbox is always reachable: an outage shows in sends, after the run started."""

    async def close(self) -> None:
        self.closed = True


__all__ = ["KINDS", "Email", "FailureKind", "Headers", "Mailbox"]

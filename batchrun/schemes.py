"""Every URL scheme batchrun knows, in one registry: the databases (``--db``), the effects
(``--mail``) and the queues (``--retry-queue``), what each can do, and the module that
opens it (imported only when a URL names it, so an SES-only deployment never imports
aiosmtplib).

A mail scheme declares what its mailer can do, so no other module lists schemes:

    dkim        batchrun signs what it sends (BATCHRUN_DKIM_KEY_FILE): smtp, smtps, file
    mailbox     it reaches people's mailboxes: one-click unsubscribe is expected
    self_signs  the provider signs (SES's Easy DKIM): batchrun never does
    rate        the provider states its send rate (``--rate auto`` starts there)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from batchrun.urls import scheme_of

Kind = Literal["db", "mail", "queue"]


@dataclass(frozen=True, slots=True)
class Scheme:
    """One URL scheme: its names, its form, the module that opens it, what it can do."""

    kind: Kind
    names: tuple[str, ...]
    form: str  # how a URL of it is written, for error lines
    module: str  # imported when a URL names the scheme
    dkim: bool = False
    mailbox: bool = False
    self_signs: bool = False
    rate: bool = False


REGISTRY: tuple[Scheme, ...] = (
    Scheme("db", ("mysql", "mariadb", "mysql+aiomysql"), "mysql://user:pass@host:port/db",
           "batchrun.db.mysql"),
    Scheme("db", ("postgresql", "postgres"), "postgresql://user:pass@host:port/db",
           "batchrun.db.postgresql"),
    Scheme("db", ("sqlite",), "sqlite:///path", "batchrun.db.sqlite"),
    Scheme("mail", ("smtp",), "smtp://host:port", "batchrun.mail.smtp", dkim=True, mailbox=True),
    Scheme("mail", ("smtps",), "smtps://host:port", "batchrun.mail.smtp", dkim=True,
           mailbox=True),
    Scheme("mail", ("file",), "file://DIR", "batchrun.mail.file", dkim=True),
    Scheme("mail", ("console",), "console://", "batchrun.mail.console"),
    Scheme("mail", ("discard",), "discard://", "batchrun.mail.console"),
    Scheme("mail", ("ses",), "ses://REGION", "batchrun.mail.ses", mailbox=True,
           self_signs=True, rate=True),
    Scheme("queue", ("https", "http"), "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME",
           "batchrun.queue.sqs"),
)  # fmt: skip


def find(kind: Kind, url: str | None) -> Scheme | None:
    """The registered scheme of ``kind`` that ``url`` names, if any."""
    name = scheme_of(url or "")
    return next((s for s in REGISTRY if s.kind == kind and name in s.names), None)


def names(kind: Kind) -> tuple[str, ...]:
    """Every scheme name of ``kind``."""
    return tuple(name for s in REGISTRY if s.kind == kind for name in s.names)


def accepted(kind: Kind) -> str:
    """The schemes of ``kind`` as an error line lists them: ``smtp://, smtps://, ...``."""
    return ", ".join(f"{name}://" for name in names(kind))


def forms(kind: Kind) -> str:
    """How URLs of ``kind`` are written: ``mysql://user:pass@host:port/db, ...``."""
    shown = [s.form for s in REGISTRY if s.kind == kind]
    return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]


def can(url: str | None, capability: Literal["dkim", "mailbox", "self_signs", "rate"]) -> bool:
    """Whether the mail scheme ``url`` names has ``capability``."""
    found = find("mail", url)
    return found is not None and bool(getattr(found, capability))


__all__ = ["REGISTRY", "Scheme", "accepted", "can", "find", "forms", "names", "scheme_of"]

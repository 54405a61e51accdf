"""The Mailer protocol and backend choice by URL; the Message lives in mail/message.py."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from batchrun import schemes
from batchrun.errors import ConfigError
from batchrun.mail.headers import encoded_words
from batchrun.mail.message import (
    MAX_ADDRESS_CHARS,
    MAX_NAME_CHARS,
    Message,
    address_header,
    clean_text,
    valid_address,
)

if TYPE_CHECKING:
    from batchrun.mail.dkim import DkimSigner

# The names batchrun.mail.base has always had, for the code and tests that import them.
__all__ = [
    "MAX_ADDRESS_CHARS",
    "MAX_NAME_CHARS",
    "Mailer",
    "Message",
    "address_header",
    "clean_text",
    "encoded_words",
    "from_url",
    "valid_address",
]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
# eu-west-1, us-gov-west-1, ap-southeast-5 ...; anything else is a typo, not a region.
_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+")


class Mailer(Protocol):
    """Sends messages; raises TemporaryMailError, MailConnectionError or PermanentMailError."""

    async def send(self, message: Message) -> None: ...

    async def check(self) -> None:
        """Make sure messages can be sent now, sending none; raise MailConnectionError with
        the cause (``cannot connect to smtp://host:25: Connection refused``)."""
        ...

    async def close(self) -> None: ...


def from_url(
    url: str,
    *,
    timeout: float = 10.0,
    pool_size: int = 4,
    env: Mapping[str, str] | None = None,
    dkim: DkimSigner | None = None,
) -> Mailer:
    """Return the mail backend a ``--mail`` URL names; imports only that backend.

    Args:
        url: ``smtp://[user:pass@]host[:port][?starttls=1&pool=N&timeout=S]``,
            ``smtps://...`` (implicit TLS), ``ses://REGION`` (``ses://`` alone takes
            ``AWS_REGION``), ``file://DIR``, ``console://`` or ``discard://``.
        timeout: connect and send timeout in seconds (``?timeout=`` overrides it).
        pool_size: most SMTP connections kept open at once (``?pool=`` overrides it);
            for SES, the HTTP connection pool (at least 10).
        env: the ``AWS_*`` variables (``Settings.extra``) for ``ses://``: region,
            endpoint (``AWS_ENDPOINT_URL_SESV2``, ``AWS_ENDPOINT_URL``) and keys.
        dkim: signs what ``smtp://``, ``smtps://`` and ``file://`` send; never used for
            ``ses://`` (SES signs with Easy DKIM) nor ``console://`` / ``discard://``.

    Raises:
        ConfigError: an unknown scheme or an unusable URL; the message never holds the
            URL itself, so a password in it is never shown.
    """
    scheme = schemes.scheme_of(url)
    if schemes.find("mail", url) is None:
        raise ConfigError(
            f"unknown mail URL scheme {scheme!r}; accepted: {schemes.accepted('mail')}"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"unusable {scheme}:// mail URL: {exc}") from None
    if scheme in ("smtp", "smtps"):
        return _smtp_from_parts(parts, scheme, timeout=timeout, pool_size=pool_size, dkim=dkim)
    if scheme == "ses":
        return _ses_from_parts(parts, env or {}, timeout=timeout, pool_size=pool_size)
    _reject_query(parts, scheme)
    if scheme == "file":
        # file://outbox is relative (the host part is the first path segment);
        # file:///var/outbox is absolute.
        directory = unquote(parts.netloc + parts.path)
        if not directory:
            raise ConfigError("file:// mail URL needs a directory, e.g. file://outbox")
        from batchrun.mail.file import FileMailer

        return FileMailer(directory, dkim=dkim)
    if scheme in ("console", "discard"):
        if parts.netloc or parts.path.strip("/"):
            raise ConfigError(f"{scheme}:// mail URL takes no host or path")
        from batchrun.mail.console import ConsoleMailer, DiscardMailer

        return ConsoleMailer() if scheme == "console" else DiscardMailer()
    raise AssertionError(f"mail scheme {scheme!r} is registered but has no backend")


def _reject_query(parts: SplitResult, scheme: str) -> None:
    """Refuse query options on a scheme that has none, rather than ignore a typo."""
    if parts.query:
        raise ConfigError(f"{scheme}:// mail URL takes no options (got ?{parts.query})")


def _ses_from_parts(
    parts: SplitResult, env: Mapping[str, str], *, timeout: float, pool_size: int
) -> Mailer:
    """Build an SesMailer from a parsed ``ses://REGION`` URL."""
    _reject_query(parts, "ses")
    if parts.path.strip("/") or "@" in parts.netloc or ":" in parts.netloc:
        raise ConfigError("ses:// mail URL takes only a region, e.g. ses://eu-west-1")
    region = parts.netloc.lower() or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
    if not region:
        raise ConfigError("ses:// mail URL needs a region (ses://eu-west-1) or AWS_REGION")
    if not _REGION.fullmatch(region):
        raise ConfigError(f"ses:// mail URL region {region!r} is not an AWS region name")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"mail timeout must be a positive number of seconds, not {timeout!r}")
    if pool_size < 1:
        raise ConfigError(f"mail pool size must be at least 1, not {pool_size!r}")
    # Imported here so a deployment that never names ses:// never imports aioboto3.
    try:
        from batchrun.mail.ses import SesMailer
    except ImportError as exc:
        raise ConfigError(
            f"ses:// mail needs aioboto3 (pip install 'batchrun[aws]'): {exc}"
        ) from None
    return SesMailer(region, env=env, timeout=timeout, pool_size=pool_size)


def _smtp_from_parts(
    parts: SplitResult,
    scheme: str,
    *,
    timeout: float,
    pool_size: int,
    dkim: DkimSigner | None = None,
) -> Mailer:
    """Build an SmtpMailer from a parsed ``smtp://`` or ``smtps://`` URL."""
    implicit_tls = scheme == "smtps"
    try:
        host = parts.hostname
        port = parts.port
    except ValueError:
        raise ConfigError(f"{scheme}:// mail URL has an invalid port") from None
    if not host:
        raise ConfigError(f"{scheme}:// mail URL needs a host, e.g. {scheme}://localhost:25")
    start_tls: bool | None = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "starttls":
            start_tls = _parse_bool(scheme, key, value)
        elif key == "pool":
            pool = _parse_positive(scheme, key, value)
            if not pool.is_integer():
                raise ConfigError(
                    f"{scheme}:// mail URL option pool={value!r} must be a whole number"
                )
            pool_size = int(pool)
        elif key == "timeout":
            timeout = _parse_positive(scheme, key, value)
        else:
            raise ConfigError(
                f"unknown option {key!r} in {scheme}:// mail URL; accepted: starttls, pool, timeout"
            )
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"mail timeout must be a positive number of seconds, not {timeout!r}")
    if pool_size < 1:
        raise ConfigError(f"mail pool size must be at least 1, not {pool_size!r}")
    if implicit_tls and start_tls:
        raise ConfigError("smtps:// is already TLS; starttls=1 applies to smtp:// only")
    if port is None:
        port = 465 if implicit_tls else 587 if start_tls else 25
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    # Imported here so a deployment that never names smtp:// never imports aiosmtplib.
    from batchrun.mail.smtp import SmtpMailer

    return SmtpMailer(
        host,
        port,
        username=username,
        password=password,
        use_tls=implicit_tls,
        start_tls=False if implicit_tls else start_tls,
        timeout=timeout,
        pool_size=pool_size,
        dkim=dkim,
    )


def _parse_bool(scheme: str, key: str, value: str) -> bool:
    """Parse a URL flag such as ``starttls=1``."""
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigError(f"{scheme}:// mail URL option {key}={value!r} is not 1 or 0")


def _parse_positive(scheme: str, key: str, value: str) -> float:
    """Parse a positive, finite number URL option such as ``pool=8`` or ``timeout=2.5``."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{scheme}:// mail URL option {key}={value!r} must be a positive number")
    return number

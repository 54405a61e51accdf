"""The one-line reasons an SMTP failure is recorded with (in the ledger, on screen, in
errors), and how a failed connect is told: the server's reply, the operating system's
words, an outage or a setup to fix."""

from __future__ import annotations

import os
import re
import socket
import ssl

from batchrun.errors import causes

# Server replies are echoed into reasons that end up in the ledger and on screen.
MAX_REASON_CHARS = 300

# A 4xx reply that asks for a lower rate ("454 Throttling failure ...") and its kin.
THROTTLE = re.compile(r"throttl|sending rate|rate limit|too many|slow down", re.IGNORECASE)


def reply_line(code: int, message: str) -> str:
    """Render a reply as one short line, e.g. ``451 4.3.0 try later``."""
    line = " ".join(f"{code} {message}".split())
    return line[:MAX_REASON_CHARS]


def failure_line(exc: BaseException) -> str:
    """Name a connection failure in a few words (refused, reset, TLS ...)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:MAX_REASON_CHARS]


def setup_fault(exc: BaseException) -> bool:
    """Whether a failed connect is the setup's fault (a host name DNS does not know, TLS
    that fails) rather than a server not answering (refused, reset, unreachable)."""
    return any(isinstance(cause, socket.gaierror | ssl.SSLError) for cause in causes(exc))


def os_words(exc: BaseException) -> str:
    """The operating system's words for a failed connect ("Connection refused")."""
    # aiosmtplib's SMTPConnectError is an OSError itself, with the socket's error as cause
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    if isinstance(cause, ssl.SSLError):
        return f"TLS failed: {cause.reason or failure_line(cause)}"
    if isinstance(cause, socket.gaierror) and cause.strerror:
        return cause.strerror  # "Name or service not known"
    if isinstance(cause, OSError) and cause.errno is not None and cause.errno > 0:
        return os.strerror(cause.errno)  # asyncio's own text names no cause
    return failure_line(cause or exc)

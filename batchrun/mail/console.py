"""Console and discard backends: show each message on stderr, or count and drop it."""

from __future__ import annotations

import sys
from typing import TextIO

from batchrun.mail.message import Message, clean_text


class ConsoleMailer:
    """Writes each message, readable, to stderr (stdout is kept for ``--json``)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        """Write to ``stream``, or to whatever ``sys.stderr`` is at each send."""
        self.sent = 0
        self._stream = stream

    async def send(self, message: Message) -> None:
        """Print the headers and the text part of ``message``."""
        stream = self._stream if self._stream is not None else sys.stderr
        # One write per message, so concurrent sends never interleave their lines.
        stream.write(render(message))
        stream.flush()
        self.sent += 1

    async def check(self) -> None:
        """Nothing to check: stderr is always there."""

    async def close(self) -> None:
        """Nothing to release; the stream belongs to the caller."""


class DiscardMailer:
    """Accepts every message and drops it: a backend with no cost, for benchmarks."""

    def __init__(self) -> None:
        """Start counting from zero."""
        self.sent = 0

    async def send(self, message: Message) -> None:
        """Count ``message`` and forget it."""
        self.sent += 1

    async def check(self) -> None:
        """Nothing to check."""

    async def close(self) -> None:
        """Nothing to release."""


def render(message: Message) -> str:
    """Return ``message`` as human-readable text: headers, blank line, text part."""
    return (
        f"----- mail {clean_text(message.message_id)} -----\n"
        f"From: {clean_text(message.sender)}\n"
        f"To: {clean_text(message.display_to)}\n"
        f"Subject: {clean_text(message.subject)}\n"
        f"\n{message.text.rstrip()}\n"
        "----- end -----\n"
    )

"""File backend: one ``.eml`` per message in an owner-only directory, for demos and tests."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.errors import MailConnectionError, PermanentMailError
from batchrun.mail.message import Message

if TYPE_CHECKING:
    from batchrun.mail.dkim import DkimSigner

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._@+=-]")
MAX_STEM_CHARS = 150


def file_name(message_id: str) -> str:
    """Return the ``.eml`` name for a Message-ID: same id, same name; safe characters only.

    A readable id keeps its name (``birthday.2025.42@example.com.eml``); an id that needed
    rewriting gets a digest suffix, so two ids never share a file.
    """
    stripped = message_id.strip().removeprefix("<").removesuffix(">")
    stem = _UNSAFE.sub("_", stripped)[:MAX_STEM_CHARS]
    if stem.startswith("."):
        stem = "_" + stem[1:]  # never a hidden file, never "." or ".."
    if stem != stripped or not stem:
        digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        stem = f"{stem}-{digest}" if stem else digest
    return f"{stem}.eml"


class FileMailer:
    """Writes each message to ``DIR/<message-id>.eml`` atomically; a resend overwrites."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: bool = False,
        dkim: DkimSigner | None = None,
    ) -> None:
        """Remember the directory; it is created (mode 0o700) on the first send.

        Args:
            directory: where the ``.eml`` files go.
            fsync: flush each file to disk before it appears, surviving power loss, not
                only a crash of this process (which atomic rename already survives).
            dkim: signs each message as an SMTP relay would receive it, so the outbox
                shows (and lets you check) the signature.
        """
        self.directory = Path(directory)
        self.sent = 0
        self._fsync = fsync
        self._dkim = dkim
        self._ready = False

    def __repr__(self) -> str:
        return f"FileMailer({str(self.directory)!r})"

    def path_for(self, message: Message) -> Path:
        """Return where ``message`` is (or will be) written."""
        return self.directory / file_name(message.message_id)

    async def send(self, message: Message) -> None:
        """Write the message's bytes to its file.

        Raises:
            PermanentMailError: the message cannot be built (a line break in an address).
            MailConnectionError: the directory cannot be written (permissions, disk full).
        """
        try:
            # An outbox file is no SMTP session: a non-ASCII local part is written as
            # UTF-8 (RFC 6532), as a server offering SMTPUTF8 would receive it.
            data = message.to_bytes(utf8=True)
            if self._dkim is not None:
                data = self._dkim.sign(data)
        except ValueError as exc:
            raise PermanentMailError(f"message cannot be built: {exc}") from exc
        path = self.path_for(message)
        try:
            # Disk writes block; a thread keeps the event loop serving other sends.
            await asyncio.to_thread(self._write, path, data)
        except OSError as exc:
            raise MailConnectionError(f"cannot write {path}: {exc.strerror or exc}") from exc
        self.sent += 1
        log.debug("wrote %s", path)

    async def check(self) -> None:
        """Make sure messages can be written: the directory exists (or is created, as the
        first send would) and a file can be created in it and removed. The preflight of a
        run; nothing is left behind but the directory.

        Raises:
            MailConnectionError: it is not a directory, or cannot be created or written
                (``cannot write to outbox: Not a directory``).
        """
        try:
            await asyncio.to_thread(self._probe)
        except OSError as exc:
            raise MailConnectionError(
                f"cannot write to {self.directory}: {exc.strerror or exc}"
            ) from exc

    async def close(self) -> None:
        """Nothing to release: every file is closed once written."""

    def _write(self, path: Path, data: bytes) -> None:
        """Write ``data`` to a temp file (0o600) in the same directory, then rename it over."""
        if not self._ready:
            self._make_directory()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".eml")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                if self._fsync:
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _probe(self) -> None:
        """Create the directory if need be, then a temp file in it, and remove the file."""
        if not self._ready:
            self._make_directory()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)

    def _make_directory(self) -> None:
        """Create the directory owner-only; leave an existing one's mode to its owner."""
        try:
            self.directory.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        else:
            # mkdir's mode is filtered by the umask; messages hold personal data.
            self.directory.chmod(0o700)
        self._ready = True

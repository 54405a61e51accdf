"""Bugs stop fast: the same non-transient error for many entities in a row is the job's
bug, not an outage, so the run stops instead of queueing every entity for a retry.

An error's signature is its type and where it was raised (the innermost frame of its
traceback); a template error's is its one line, which names the template and the
variable, as is any setting's error (``ConfigError``: a backend's URL not set) and a
job's statement the database refused as written (``StatementError``). Transient
errors have none: batchrun's own (mail, database, queue), a job's
verdicts (Skip, Retry, Fail), OSError and TimeoutError, httpx's. ``BATCHRUN_BUG_THRESHOLD``
(default 10) entities in a row with one signature trip the streak; any other outcome in
between (a success, a skip, another error) starts it again.
"""

from __future__ import annotations

import asyncio
import sys
import sysconfig
from pathlib import Path
from types import TracebackType

from batchrun.errors import (
    BatchrunError,
    ConfigError,
    MissingTemplateError,
    StatementError,
    TemplateError,
)
from batchrun.job import Skip, Verdict
from batchrun.urls import mask_url

Signature = tuple[str, str]


def signature(exc: BaseException) -> Signature | None:
    """The error's (type, origin), or None for an error that may pass by itself."""
    if isinstance(exc, ConfigError | StatementError):  # a template's, a backend's URL not
        return type(exc).__qualname__, str(exc)  # set, an SQL refused as written: never passes
    if isinstance(exc, BatchrunError | Verdict | OSError | TimeoutError):
        return None
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.HTTPError):
        return None
    return type(exc).__qualname__, _origin(exc.__traceback__)


def _origin(tb: TracebackType | None) -> str:
    """Where the error was raised in the job's own code: the innermost frame outside
    batchrun, the standard library and installed packages (``json.loads`` failing says the
    job's line that called it, not decoder.py's), else the innermost frame."""
    if tb is None:
        return "?"
    innermost = ours = None
    while tb is not None:
        innermost = tb
        if not tb.tb_frame.f_code.co_filename.startswith(_NOT_THE_JOBS):
            ours = tb
        tb = tb.tb_next
    found = ours or innermost
    assert found is not None
    return f"{found.tb_frame.f_code.co_filename}:{found.tb_lineno}"


def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    folders.add(str(Path(__file__).resolve().parent.parent))  # batchrun itself
    return tuple(sorted(f.rstrip("/") + "/" for f in folders))


_NOT_THE_JOBS = _library_folders()


class BugStreak:
    """Counts consecutive entities that failed with one signature, and admits entities so
    that a bug touches at most ``threshold`` of them whatever the concurrency: until the
    first success, and while a streak is building, attempts in flight plus the streak
    stay below the threshold."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.count = 0
        self.in_flight = 0
        self.proven = False  # an entity succeeded (since the last bug failure)
        self._signature: Signature | None = None
        self._changed: asyncio.Condition | None = None
        self._waiting = 0  # admits waiting on _changed: done() wakes them, if any
        self.tripped: str | None = None  # the one line saying what the bug is, once tripped

    def _open(self) -> bool:
        return (self.proven and self.count == 0) or self.in_flight + self.count < self.threshold

    async def admit(self) -> bool:
        """Wait for room to attempt one entity; False once the streak has tripped."""
        if self.tripped is None and not self._open():
            if self._changed is None:
                self._changed = asyncio.Condition()
            self._waiting += 1
            try:
                async with self._changed:
                    await self._changed.wait_for(lambda: self.tripped is not None or self._open())
            finally:
                self._waiting -= 1
        if self.tripped is not None:
            return False
        self.in_flight += 1
        return True

    async def done(self) -> None:
        """One admitted attempt has its outcome (counted by ``success`` or ``failure``)."""
        self.in_flight -= 1
        if self._changed is not None and self._waiting:
            async with self._changed:
                self._changed.notify_all()

    def success(self) -> None:
        self.proven = True
        self.count = 0
        self._signature = None

    def failure(self, exc: BaseException, *, job: str) -> bool:
        """Count one entity's error; True when this one tripped the streak."""
        found = signature(exc)
        if found is None:
            if isinstance(exc, Skip):
                self.proven = True  # the job's code ran and decided
            self.count = 0  # not a bug: the streak starts again
            self._signature = None
            return False
        self.proven = False
        if found == self._signature:
            self.count += 1
        else:
            self._signature, self.count = found, 1
        # A template no folder has (a typo in template=): no entity can pass, so the first
        # one stops the run, as a template missing from the job's folder stops it before.
        at_once = isinstance(exc, MissingTemplateError)
        if self.tripped is None and (self.count >= self.threshold or at_once):
            text = mask_url(str(exc)).splitlines()[0][:200] if str(exc) else ""
            if isinstance(exc, TemplateError):
                what = f"has a bug: {found[0]}: {text}"
            elif isinstance(exc, ConfigError):
                what = f"cannot run as it is set up: {text}"
            else:
                what = f"has a bug: {found[0]}: {text} at {_short_origin(found[1])}"
            self.tripped = (
                f"job {job!r} {what} ({self.count} entities in a row); stopped, those queued "
                "for retry, the rest left pending"
            )
            return True
        return False


def _short_origin(origin: str) -> str:
    path, _, line = origin.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}"

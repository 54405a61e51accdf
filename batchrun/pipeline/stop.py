"""Stopping: a graceful stop a second request escalates to an abort, signals, deadlines.

SIGINT and SIGTERM request a stop on a ``StopToken`` (the second one aborts); a Lambda's
``Deadline`` requests one when the time left falls to its margin. Runners and runs watch
the token: they take no new work, let in-flight work finish, and hand the rest on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

__all__ = ["Deadline", "StopToken", "install_signal_handlers"]

logger = logging.getLogger("batchrun.pipeline.engine")


@dataclass(eq=False)
class StopToken:
    """A graceful stop that a second request escalates to an abort.

    Not thread-safe: call it from the event loop's thread (``loop.add_signal_handler``
    callbacks qualify; a foreign thread must use ``loop.call_soon_threadsafe``).
    """

    reason: str | None = field(default=None, init=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _aborting: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    # called synchronously by the first request, so runners halt before any task runs again
    _on_stop: list[Callable[[], None]] = field(default_factory=list, init=False, repr=False)
    _on_abort: list[Callable[[], None]] = field(default_factory=list, init=False, repr=False)
    _detach: Callable[[], None] | None = field(default=None, init=False, repr=False)

    @property
    def stopping(self) -> bool:
        """True once a stop (or an abort) was requested."""
        return self._stopping.is_set()

    @property
    def aborting(self) -> bool:
        """True once in-flight work must be cancelled at once."""
        return self._aborting.is_set()

    def request(self, reason: str) -> None:
        """Stop taking new work; a second request aborts in-flight work.

        Args:
            reason: why, for the log and ``RunResult.stopped_reason`` (the first one is kept).
        """
        if self._stopping.is_set():
            self.request_abort(reason)
            return
        self.reason = reason
        logger.info("stop requested: %s", reason)
        self._set_stopping()

    def request_abort(self, reason: str) -> None:
        """Stop taking new work and cancel in-flight work at once.

        Args:
            reason: why, for the log (kept as ``reason`` only if no stop came first).
        """
        if self._aborting.is_set():
            return
        if self.reason is None:
            self.reason = reason
        logger.warning("abort requested: %s", reason)
        self._set_stopping()
        self._aborting.set()
        for callback in list(self._on_abort):
            callback()

    def child(self) -> StopToken:
        """A token that stops and aborts with this one, and can also be stopped alone
        (one run inside a long-lived worker); ``detach`` it when done."""
        child = StopToken()

        def stop() -> None:
            child.request(self.reason or "stopped")

        def abort() -> None:
            child.request_abort(self.reason or "aborted")

        self._on_stop.append(stop)
        self._on_abort.append(abort)

        def detach() -> None:
            for hooks, hook in ((self._on_stop, stop), (self._on_abort, abort)):
                with contextlib.suppress(ValueError):
                    hooks.remove(hook)

        child._detach = detach
        if self.aborting:
            abort()
        elif self.stopping:
            stop()
        return child

    def detach(self) -> None:
        """Stop following the parent token (see ``child``)."""
        if self._detach is not None:
            self._detach()
            self._detach = None

    def _set_stopping(self) -> None:
        """Set the stopping flag once and tell the runners at once."""
        if not self._stopping.is_set():
            self._stopping.set()
            for callback in list(self._on_stop):
                callback()

    async def wait_stopping(self) -> None:
        """Return once a stop is requested."""
        await self._stopping.wait()

    async def wait_aborting(self) -> None:
        """Return once an abort is requested."""
        await self._aborting.wait()


def install_signal_handlers(
    loop: asyncio.AbstractEventLoop, token: StopToken
) -> Callable[[], None]:
    """Route SIGINT and SIGTERM to ``token``: the first stops, the second aborts.

    After the abort, the handlers uninstall themselves, so a third signal reaches whatever
    handled it before (``asyncio.run`` cancels its main task on SIGINT) for a hung shutdown.

    Args:
        loop: the running loop; must run in the main thread, else nothing is installed.
        token: the token to request the stop on.

    Returns:
        A function that restores the previous handlers; calling it twice is harmless.
    """
    previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}

    def uninstall() -> None:
        while previous:
            sig, handler = previous.popitem()
            loop.remove_signal_handler(sig)
            # remove_signal_handler installs the default; put back what was there, such as
            # asyncio.run's own SIGINT handler
            if handler is not None:
                signal.signal(sig, handler)

    def on_signal(sig: signal.Signals) -> None:
        token.request(f"received {sig.name}")
        if token.aborting:
            uninstall()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            before = signal.getsignal(sig)
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError) as exc:
            # Windows loops, or not the main thread (some embedding runtimes)
            logger.debug("cannot handle %s: %s", sig.name, exc)
            continue
        previous[sig] = before
    return uninstall


@dataclass(frozen=True)
class Deadline:
    """Requests a graceful stop when the time left falls to a safety margin (Lambda)."""

    remaining_ms: Callable[[], int]
    margin_ms: int
    poll_s: float = 0.1

    def expired(self) -> bool:
        """True when no more than ``margin_ms`` remain."""
        return self.remaining_ms() <= self.margin_ms

    async def watch(self, token: StopToken) -> None:
        """Request a stop on ``token`` at the margin; return early if it stops otherwise.

        Args:
            token: the run's stop token. A token already stopping is left alone, so the
                deadline never escalates someone else's stop into an abort.
        """
        while not token.stopping:
            remaining = self.remaining_ms()
            left_ms = remaining - self.margin_ms
            if left_ms <= 0:
                token.request(f"deadline: {remaining} ms left, margin {self.margin_ms} ms")
                return
            await asyncio.sleep(min(self.poll_s, left_ms / 1000))

"""Deadlines for many concurrent sends on one timer: the per-message bound of SmtpMailer.

``asyncio.timeout`` schedules a timer and cancels it for every message: a TimerHandle on
the loop's heap, a current_task look-up and the cancelled handle's later removal, some
10 us of a message's CPU, measured (a tenth of the mailer's own work per message). Here
a send notes its deadline in a dict, and one timer, armed while any send is under way,
checks them every ``tick`` (an eighth of the timeout, within 10 ms and 1 s): an overdue
send is cancelled and its ``CancelledError`` becomes ``TimeoutError``, as under
``asyncio.timeout``, which cancels the same way. A send is never cut short before its
timeout, and at most one tick after it.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

MIN_TICK_S = 0.01
MAX_TICK_S = 1.0


class Deadlines:
    """``with deadlines.bound():`` around the awaits of one send, in the sending task."""

    def __init__(self, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.timeout = timeout
        self.tick = min(max(timeout / 8, MIN_TICK_S), MAX_TICK_S)
        # task -> (its deadline, its cancelling() count when the bound began)
        self._due: dict[asyncio.Task[object], tuple[float, int]] = {}
        self._expired: set[asyncio.Task[object]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def bound(self) -> _Bound:
        """The deadline of the current task's next ``timeout`` seconds."""
        return _Bound(self)

    def _check(self) -> None:
        now = time.monotonic()
        for task, (due, _) in list(self._due.items()):
            if due <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._timer = (
            asyncio.get_running_loop().call_later(self.tick, self._check) if self._due else None
        )


class _Bound:
    __slots__ = ("_deadlines", "_task")

    def __init__(self, deadlines: Deadlines) -> None:
        self._deadlines = deadlines
        self._task: asyncio.Task[object] | None = None

    def __enter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a send's deadline must be taken inside a task")
        d = self._deadlines
        self._task = task
        d._due[task] = (time.monotonic() + d.timeout, task.cancelling())
        if d._timer is None:
            d._timer = asyncio.get_running_loop().call_later(d.tick, d._check)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        d, task = self._deadlines, self._task
        assert task is not None
        _, cancelling = d._due.pop(task)
        if not d._due and d._timer is not None:
            d._timer.cancel()  # nothing left to watch (a timer of an ended loop included)
            d._timer = None
        if task in d._expired:
            d._expired.discard(task)
            # Ours alone, as asyncio.timeout tells: a cancel from outside stays a cancel.
            if task.uncancel() <= cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

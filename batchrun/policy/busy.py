"""Busy backends: how long an entity waits in-process, and how long a consumer's message
then waits on its queue.

Busy (a backend not ready, no free slot, an answer 429 / 503) is never a failure:

    a period run      waits with backoff until the backend is free; only a stop ends the
                      wait (the entity is released, left for the next run or hand-off)
    a consumer        waits ``BATCHRUN_BUSY_WAIT_S`` at most (a Lambda: and no later than
    (retry, worker,   its deadline's stop), then gives the entity back to the queue after
    Lambda)           ``busy_delay_s``, which grows each time the message comes back busy;
                      no attempt is counted and no receive reaches the dead-letter limit

``Patience`` is one entity's budget; the worker sets it (``patience()`` reads it) so the
gate of every backend the entity calls waits within the same budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from batchrun.pipeline.stop import StopToken

T = TypeVar("T")

BACKOFF_FIRST_S = 0.05  # an entity's first wait after a busy answer
BACKOFF_MAX_S = 5.0  # its longest (a Retry-After asks for longer, up to the budget)
GIVE_BACK_BASE_S = 1.0  # a consumer's first give-back delay
GIVE_BACK_MAX_S = 300.0  # its longest: within SQS's 15-minute DelaySeconds


class Patience:
    """How long one entity may wait for busy backends: ``limit_s`` from now (None: no
    limit, a period run), and never past a stop of ``stop``.

    Args:
        stop: ends every wait at once when it stops (None: nothing ends it early).
        limit_s: seconds in all; 0 waits not at all.
        clock: monotonic seconds (a fake one in tests).
    """

    def __init__(
        self,
        stop: StopToken | None,
        limit_s: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stop = stop
        self.clock = clock
        self.deadline = None if limit_s is None else clock() + max(0.0, limit_s)
        self.busy = 0  # busy answers so far: the next backoff

    def left_s(self) -> float:
        """Seconds this entity may still wait (``inf`` without a limit; 0 once stopped)."""
        if self.stop is not None and self.stop.stopping:
            return 0.0
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - self.clock())

    def backoff_s(self, asked_s: float | None = None) -> float:
        """The next wait after a busy answer: ``asked_s`` (a Retry-After) if given, else
        50 ms doubling to 5 s, with jitter in its upper half."""
        self.busy += 1
        if asked_s is not None and asked_s > 0:
            return asked_s
        ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.busy - 1))
        return float(ceiling * random.uniform(0.5, 1.0))

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; False, at once or when it comes, if the budget is spent first
        or the stop comes (the caller gives up), else True."""
        left = self.left_s()
        if left <= 0 or seconds > left:
            return False
        return await self.until(asyncio.sleep(seconds)) is not _STOPPED

    async def until(self, waited: Awaitable[T], limit_s: float | None = None) -> T | object:
        """``waited``'s result, or ``STOPPED`` when the budget (or ``limit_s``) runs out or
        the stop comes first (``waited`` is cancelled then)."""
        left = min(self.left_s(), math.inf if limit_s is None else limit_s)
        task = asyncio.ensure_future(waited)
        if left <= 0:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return _STOPPED
        watchers = [task]
        stopping: asyncio.Task[None] | None = None
        if self.stop is not None:
            stopping = asyncio.ensure_future(self.stop.wait_stopping())
            watchers.append(stopping)  # type: ignore[arg-type]
        try:
            await asyncio.wait(
                watchers,
                timeout=None if math.isinf(left) else left,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if stopping is not None:
                stopping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stopping
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return _STOPPED


_STOPPED = object()
STOPPED = _STOPPED  # what ``Patience.until`` returns when it gave up

# The entity being worked's patience (set by the worker around ``process``); None outside
# the road (a test calling ``process``): busy is raised at once then.
_PATIENCE: ContextVar[Patience | None] = ContextVar("batchrun_patience", default=None)


def patience() -> Patience:
    """The patience of the entity being worked, or one that does not wait."""
    found = _PATIENCE.get()
    return found if found is not None else Patience(None, 0.0)


def set_patience(value: Patience | None) -> Callable[[], None]:
    """Make ``value`` the current entity's patience; returns what restores the last one."""
    token = _PATIENCE.set(value)
    return lambda: _PATIENCE.reset(token)


def busy_delay_s(
    times: int,
    asked_s: float | None = None,
    *,
    base_s: float = GIVE_BACK_BASE_S,
    max_s: float = GIVE_BACK_MAX_S,
) -> float:
    """How long a consumer's message waits on its queue after its ``times``-th busy
    give-back in a row (1 for the first): ``base_s`` doubling, at most ``max_s``, with
    jitter in its upper half; at least what the backend asked (``Retry-After``), up to
    ``max_s``."""
    ceiling = min(max_s, base_s * 2 ** max(0, times - 1))
    delay = ceiling * random.uniform(0.5, 1.0)
    if asked_s is not None and asked_s > 0:
        delay = max(delay, min(asked_s, max_s))
    return float(delay)


__all__ = ["STOPPED", "Patience", "busy_delay_s", "patience", "set_patience"]

"""Adaptive send rate: pace sends (or calls), and find the provider's limit by AIMD.

``AdaptiveRate`` is an async context manager with aiolimiter's shape (``async with
limiter:`` around each send), so the engine can hold either. Unlike ``AsyncLimiter`` its
rate changes at run time: ``throttled()`` halves it (multiplicative decrease) and
``succeeded()`` raises it by ``increase`` sends/s per second of sending (additive increase),
the law TCP uses to share a link. Against a provider with a hard limit ``L`` the rate climbs
to ``L``, is throttled back to about ``L/2``, and climbs again: a sawtooth whose mean is
about ``0.75 * L``. Leaving the ``async with`` block feeds the law by itself: a clean exit
is a success, a ``ThrottledError`` a throttle, any other error neither.

A named backend's rate (``effects/backends.py``) takes a gentler law: ``slow_start``
doubles the rate each second until the first throttle, and ``decrease=0.9`` saws between
``0.9 * L`` and ``L``, a mean near ``0.95 * L`` (``python -m bench.backend_rate``).

Why not build on aiolimiter (read in 1.3.0's ``leakybucket.py``): ``AsyncLimiter.max_rate``
and ``time_period`` are plain attributes, but the leak rate is cached at construction in the
private slot ``_rate_per_sec`` and used by ``_leak`` and ``_wake_next``, so reassigning them
changes only the bucket's size (the burst), not the pace, and a waiter's wake-up timer is
not recomputed; AIMD would have to write that private slot and re-arm the private waker.
It has no hold-until (a ``Retry-After`` that stops every caller for a while), no way to
tell a caller who waited from one who did not (what lets a success grow the rate here, as
RFC 7661 asks), and its clock is the loop's only, where this class takes an injectable
``clock`` and ``sleep`` for tests. So the metering stays here and batchrun does not
depend on aiolimiter.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from batchrun.errors import ThrottledError

__all__ = ["AdaptiveRate"]

# Float slack on a computed wait: sleeping 1e-17 s with a fake clock would never advance it.
_TOLERANCE_S = 1e-9


class AdaptiveRate(AbstractAsyncContextManager[None]):
    """A leaky-bucket pacer whose rate follows AIMD feedback from the provider."""

    def __init__(
        self,
        initial: float,
        *,
        ceiling: float | None = None,
        floor: float = 0.5,
        increase: float = 1.0,
        window_s: float = 1.0,
        burst: float = 1.0,
        settle_s: float = 10.0,
        max_pause_s: float = 60.0,
        decrease: float = 0.5,
        slow_start: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Start pacing at ``initial`` sends per second.

        Args:
            initial: the starting rate in sends/s, clamped into ``[floor, ceiling]``.
            ceiling: the highest rate ever used, e.g. the provider's MaxSendRate; None for
                no cap (settable later through ``ceiling``).
            floor: the lowest rate a throttle can push the rate down to.
            increase: additive increase, in sends/s gained per second of rate-bound success.
            window_s: throttles within this long of the last decrease do not decrease again,
                so a burst of throttles from one moment (the sends already in flight, and
                the provider's own one-second window still full) counts once.
            burst: sends that may go back to back after an idle spell; 1 spaces every send
                ``1/rate`` apart.
            settle_s: time constant of ``settled``, the rate's recent time-weighted mean.
            max_pause_s: cap on a provider's ``retry_after_s`` hint.
            decrease: what a throttle multiplies the rate by (0.5: TCP's halving).
            slow_start: until the first throttle, each second of rate-bound success
                doubles the rate (TCP's slow start) instead of adding ``increase``.
            clock: monotonic seconds; the loop's or a fake one in tests.
            sleep: awaits a number of seconds; must advance ``clock`` by that much.

        Raises:
            ValueError: a rate, bound or duration that is not a positive finite number
                (``increase`` and ``window_s`` may be 0), a ceiling below the floor, or a
                burst below 1.
        """
        _check_positive("initial", initial)
        _check_positive("floor", floor)
        if ceiling is not None:
            _check_positive("ceiling", ceiling)
            if ceiling < floor:
                raise ValueError(f"ceiling {ceiling:g} is below floor {floor:g}")
        for name, value in (("increase", increase), ("window_s", window_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        _check_positive("settle_s", settle_s)
        _check_positive("max_pause_s", max_pause_s)
        if not (math.isfinite(decrease) and 0 < decrease < 1):
            raise ValueError(f"decrease must be a number between 0 and 1, got {decrease!r}")
        self._decrease = decrease
        self._slow_start = slow_start
        self._floor = floor
        self._ceiling = ceiling
        self._increase = increase
        self._window_s = window_s
        self._burst = burst
        self._settle_s = settle_s
        self._max_pause_s = max_pause_s
        self._clock = clock
        self._sleep = sleep
        now = clock()
        self._rate = self._clamp(initial)
        # Leaky bucket: _level sends are "in the bucket" as of _leaked_at and drain at the
        # current rate; a send may start when _level + 1 <= burst. Draining up to now before
        # every rate change keeps each stretch of time paced at the rate it had.
        self._level = 0.0
        self._leaked_at = now
        self._paused_until = now
        # True when the last send found sends queued ahead of it (the pacer, not the
        # caller, set the pace); only then is a success evidence the rate could be higher.
        self._backlogged = False
        self._last_decrease: float | None = None
        # FIFO hand-off: one task at a time waits for the next slot, computed with the rate
        # current when the slot comes up, so a rate change applies to every waiting send.
        self._turn = asyncio.Lock()
        self._settled = self._rate
        self._settled_at = now
        self.peak = self._rate
        self.throttles = 0
        self.decreases = 0

    def __repr__(self) -> str:
        return (
            f"AdaptiveRate(rate={self._rate:.3g}/s, peak={self.peak:.3g}/s, "
            f"throttles={self.throttles}, ceiling={self._ceiling})"
        )

    @property
    def rate(self) -> float:
        """The current pace in sends per second."""
        return self._rate

    @property
    def ceiling(self) -> float | None:
        """The highest rate ever used (None: no cap)."""
        return self._ceiling

    @ceiling.setter
    def ceiling(self, value: float | None) -> None:
        """Set the cap, e.g. once the provider's MaxSendRate is known; lowers the rate if needed."""
        if value is not None:
            _check_positive("ceiling", value)
            value = max(value, self._floor)
        self._ceiling = value
        self._set_rate(self._clamp(self._rate), self._clock())

    def paused_s(self) -> float:
        """Seconds until a throttle's ``retry_after_s`` stops holding every send back."""
        return max(0.0, self._paused_until - self._clock())

    @property
    def settled(self) -> float:
        """The rate's time-weighted mean over about the last ``settle_s`` seconds.

        An exponentially weighted mean (time constant ``settle_s``) of the rate as a
        function of time: after a run that found the provider's limit ``L`` it sits near
        the sawtooth's mean, about ``0.75 * L``; without throttles it follows the rate.
        """
        return self._settled_now(self._clock())

    async def acquire(self, *, pause_limit_s: float = math.inf) -> bool:
        """Wait for this send's slot at the current rate (FIFO among waiting sends).

        Args:
            pause_limit_s: give up (False, no slot taken) rather than wait for a
                throttle's hold-until that ends later than this from now; the pace
                itself is always waited for.
        """
        async with self._turn:
            arrived = self._clock()
            self._leak(arrived)
            give_up_at = arrived + pause_limit_s
            # a send already in the bucket (every task queued behind the lock finds the one
            # before it there): the pacer, not the caller, sets the pace
            backlogged = self._level > _TOLERANCE_S
            while True:
                now = self._clock()
                self._leak(now)
                if self._paused_until > now + _TOLERANCE_S and self._paused_until > give_up_at:
                    return False
                wait = max((self._level + 1 - self._burst) / self._rate, self._paused_until - now)
                if wait <= _TOLERANCE_S:
                    break
                backlogged = True
                await self._sleep(wait)
            self._level = max(self._level, 0.0) + 1
            self._backlogged = backlogged
            return True

    def succeeded(self) -> None:
        """Record a send the provider accepted: grow the rate by ``increase`` per second.

        Each success adds ``increase / rate``; at ``rate`` successes a second that is
        ``increase`` sends/s per second. A success while the caller, not the pacer, set the
        pace (no send was waiting) is no evidence a higher rate would pass, so it does not
        grow the rate (TCP's congestion-window validation, RFC 7661).
        """
        if not self._backlogged or self._increase == 0:
            return
        if self._slow_start:  # 2 ** (1 / rate) per success: twice the rate per second
            grown = self._rate * 2 ** (1 / self._rate)
        else:
            grown = self._rate + self._increase / self._rate
        self._set_rate(self._clamp(grown), self._clock())

    def throttled(self, retry_after_s: float | None = None) -> bool:
        """Record a throttle: halve the rate (``decrease``), at most once per ``window_s``;
        a slow start ends here.

        Args:
            retry_after_s: the provider's hint, if any: no send starts before it passes
                (capped at ``max_pause_s``).

        Returns:
            True when this throttle lowered the rate, False when an earlier one in the same
            window already had.
        """
        now = self._clock()
        self.throttles += 1
        if retry_after_s is not None and retry_after_s > 0:
            pause = min(retry_after_s, self._max_pause_s)
            self._paused_until = max(self._paused_until, now + pause)
        if self._last_decrease is not None and now - self._last_decrease < self._window_s:
            return False
        self._last_decrease = now
        self.decreases += 1
        self._slow_start = False
        self._set_rate(max(self._floor, self._rate * self._decrease), now)
        return True

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.succeeded()
        elif isinstance(exc, ThrottledError):
            self.throttled(exc.retry_after_s)
        # any other error says nothing about the rate; the exception propagates

    def _clamp(self, rate: float) -> float:
        """``rate`` within ``[floor, ceiling]``."""
        rate = max(rate, self._floor)
        if self._ceiling is not None:
            rate = min(rate, self._ceiling)
        return rate

    def _set_rate(self, rate: float, now: float) -> None:
        """Switch to ``rate`` from ``now`` on, closing the books on the old one."""
        self._leak(now)
        self._settled = self._settled_now(now)
        self._settled_at = now
        self._rate = rate
        self.peak = max(self.peak, rate)

    def _leak(self, now: float) -> None:
        """Drain the bucket at the current rate up to ``now``."""
        elapsed = now - self._leaked_at
        if elapsed > 0:
            self._level = max(0.0, self._level - elapsed * self._rate)
            self._leaked_at = now

    def _settled_now(self, now: float) -> float:
        """``settled`` at ``now``: the rate held since the last change, blended in."""
        elapsed = now - self._settled_at
        if elapsed <= 0:
            return self._settled
        weight = 1 - math.exp(-elapsed / self._settle_s)
        return self._settled + (self._rate - self._settled) * weight


def _check_positive(name: str, value: float) -> None:
    """Refuse a non-positive, infinite or NaN setting."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")

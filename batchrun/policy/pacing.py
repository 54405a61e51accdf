"""Pacing any effect: a rate with AIMD, and a circuit breaker, around each call.

``Pacer.call()`` is what ``ctx.paced()`` and the mail path hold around one call to an
outside service (an SMTP send, an HTTP request):

    breaker open          -> the call does not start: Retry (the run stops and queues the rest)
    the rate's next slot  -> awaited (``AdaptiveRate``: ``--rate R``, or ``auto``)
    clean exit            -> a success: AIMD may raise the rate
    throttled (HTTP 429,  -> AIMD halves the rate; ``Retry-After`` holds every call back
      SES, SMTP 454)
    a known error         -> raised as the verdict it means (``EffectRetry``/``EffectFail``,
      (httpx, mail)          carrying its outcome), so a connection failure still counts
                             toward the breaker where the entity's outcome is decided

One pacer serves a run (or a queue drain): mail and every other effect share its rate
and its breaker. A named backend (``Job.backends``: its own rate, concurrency, ready probe
and breaker) has a gate of its own instead (``policy/gate.py``); ``--rate`` caps each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from batchrun.db.store import State
from batchrun.job import Verdict
from batchrun.pipeline.outcomes import EffectRetry, Outcome, as_verdict, effect_outcome
from batchrun.policy.rate import AdaptiveRate

BREAKER_REASON = "mail backend unreachable (circuit breaker open)"
_OPEN = "(circuit breaker open)"


def breaker_reason(backend: str) -> str:
    """Why a run stops when the named backend's own breaker opens."""
    return f"backend {backend!r} unreachable {_OPEN}"


def stopped_by_breaker(stopped: str | None) -> bool:
    """Whether a run's ``stopped`` says a breaker opened (mail's, or a named backend's)."""
    return stopped is not None and (stopped == BREAKER_REASON or stopped.endswith(_OPEN))


class CircuitBreaker:
    """Opens after ``threshold`` consecutive connection-level failures."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.consecutive = 0
        self.open = False
        self.reason: str | None = None  # why it opened, when a halt (not a count) did

    def success(self) -> None:
        self.consecutive = 0
        self.reason = None

    def half_open(self) -> None:
        """After a pause, let one attempt through: one more failure opens it again."""
        self.open = False
        self.consecutive = self.threshold - 1

    def failure(self, *, halt: bool = False) -> bool:
        """Record a failure; True when this one opened the breaker. ``halt`` (the provider
        refuses all mail until someone acts) opens it at once."""
        self.consecutive += 1
        if halt:
            self.consecutive = max(self.consecutive, self.threshold)
        if not self.open and self.consecutive >= self.threshold:
            self.open = True
            return True
        return False


class Pacer:
    """The rate and the breaker one backend's calls go through.

    Args:
        limiter: the pace (None: no ``--rate``, calls go as fast as the concurrency allows).
        breaker: opened by the worker that sees the connection failures; read here.
        name: the backend's name, for logs and summaries.
    """

    def __init__(
        self,
        limiter: AdaptiveRate | None,
        breaker: CircuitBreaker,
        *,
        name: str = "default",
    ) -> None:
        self.limiter = limiter
        self.breaker = breaker
        self.name = name
        self.calls = 0  # calls started through the pacer
        self.throttles = 0  # calls the peer throttled

    @asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Hold one call to the backend: wait for its slot, feed back how it went."""
        if self.breaker.open:
            raise EffectRetry(Outcome(State.RETRYING, self.breaker.reason or BREAKER_REASON))
        if self.limiter is not None:
            await self.limiter.acquire()
        self.calls += 1
        try:
            yield
        except Verdict:
            raise  # the job's own decision: says nothing about the backend
        except Exception as exc:
            outcome = effect_outcome(exc)
            if outcome is None:
                raise  # not the backend's answer (a bug in the caller): the worker's to judge
            if outcome.throttled:
                self.throttles += 1
                if self.limiter is not None:
                    self.limiter.throttled(outcome.delay_s)
            raise as_verdict(outcome) from exc
        if self.limiter is not None:
            self.limiter.succeeded()


__all__ = ["BREAKER_REASON", "CircuitBreaker", "Pacer", "breaker_reason", "stopped_by_breaker"]

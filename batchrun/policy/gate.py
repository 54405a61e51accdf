"""One named backend's calls in this process: its breaker, its ready probe, its slots and
its rate, around each call (``ctx.backend(name)``, every request of ``ctx.http(name)``).

    breaker open        -> the call does not start: the run stops (its breaker opens with
                           the backend's reason) and queues the rest
    a slot              -> of ``concurrency`` in this process; with ``shared``, also one
                           of the database's (``policy/slots.py``)
    ready               -> the probe, asked afresh at most every ``ready_every_s``
    the rate            -> its next slot (``AdaptiveRate``: the backend's rate, ``--rate``)
    the call            -> clean exit: a success (AIMD may raise the rate)
                           Busy, an httpx 429 / 503: busy (AIMD lowers the rate,
                           ``Retry-After`` holds every call back)
                           a connection failure: the backend's breaker counts it
                           another known error: its verdict (``EffectRetry``/``EffectFail``)

Waiting for a slot or for ``ready`` is busy: it lasts as long as the entity's patience
(``policy/busy.py``): in a run until the backend is free, in a consumer
``BATCHRUN_BUSY_WAIT_S``; then ``Busy`` is raised and the road gives the entity back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from batchrun.db.store import State
from batchrun.job import Busy, Verdict
from batchrun.pipeline.outcomes import EffectRetry, Outcome, as_verdict, busy_answer
from batchrun.policy.busy import STOPPED, Patience, patience
from batchrun.policy.pacing import CircuitBreaker, breaker_reason
from batchrun.policy.rate import AdaptiveRate
from batchrun.policy.slots import SharedSlots, Slot

if TYPE_CHECKING:
    from batchrun.backend import Backend
    from batchrun.job import Context

log = logging.getLogger(__name__)

SLOT_POLL_FIRST_S = 0.02  # a shared slot is looked for again after this, doubling ...
SLOT_POLL_MAX_S = 0.5  # ... to this (a slot this process lets go wakes its waiters at once)
PROBE_TIMEOUT_S = 10.0  # a ready probe that hangs longer is a "not ready"

# The backends the running code is inside of: a call nested in another to the same
# backend (ctx.http in ``async with ctx.backend``), and ``ready`` itself, go straight on.
_INSIDE: ContextVar[frozenset[str]] = ContextVar("batchrun_inside", default=frozenset())


def inside(name: str) -> bool:
    """Whether the running code is in a call to (or the ready probe of) backend ``name``."""
    return name in _INSIDE.get()


@dataclass(slots=True)
class Held:
    """What one call holds while it runs."""

    local: bool = False
    slot: Slot | None = None


class BackendGate:
    """Every call to one backend from this process.

    Args:
        name: the backend's name (``Job.backends``).
        backend: its figures, the deployment's overrides applied.
        limiter: its pace (None: no rate).
        breaker: its own circuit breaker (``BATCHRUN_BREAKER_THRESHOLD``).
        slots: its slots in the database, when ``shared``.
        clock: monotonic seconds, for the ready probe's age (a fake one in tests).
    """

    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        limiter: AdaptiveRate | None,
        breaker: CircuitBreaker,
        slots: SharedSlots | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.backend = backend
        self.limiter = limiter
        self.breaker = breaker
        self.slots = slots
        self.clock = clock
        self.local = asyncio.Semaphore(backend.concurrency) if backend.concurrency else None
        self.calls = 0  # calls started
        self.throttles = 0  # answers 429 / 503
        self.busy_waits = 0  # calls that found it busy (waited, or were given back)
        self._freed = asyncio.Event()  # set when this process lets a shared slot go
        # The last ready answer: when it was asked, what it said, calls started on it.
        self._asked_at: float | None = None
        self._ready = False
        self._uses = 0
        self._probe_lock = asyncio.Lock()

    def figures(self) -> dict[str, Any]:
        """``calls, throttles, busy_waits, rate`` for the summary (rate: settled calls/s,
        None without a rate)."""
        return {
            "calls": self.calls,
            "throttles": self.throttles,
            "busy_waits": self.busy_waits,
            "rate": None if self.limiter is None else round(self.limiter.settled, 2),
        }

    @asynccontextmanager
    async def call(self, ctx: Context) -> AsyncIterator[None]:
        """Hold one call: wait for a slot, ``ready`` and the rate; feed back how it went."""
        if inside(self.name):  # nested in a call to this backend: that one holds it
            yield
            return
        held = await self._enter(ctx, patience())
        token = _INSIDE.set(_INSIDE.get() | {self.name})
        try:
            yield
        except Busy as exc:
            self._busy(exc)
            raise
        except Verdict:
            raise  # the job's own decision: says nothing about the backend
        except Exception as exc:
            busy = busy_answer(exc, self.name)
            if busy is not None:
                self._busy(busy)
                raise busy from exc
            raise self._failed(exc) from exc
        else:
            self.breaker.success()
            if self.limiter is not None:
                self.limiter.succeeded()
        finally:
            _INSIDE.reset(token)
            await self._leave(held)

    def half_open(self) -> None:
        """After a pause, let one call through (see ``CircuitBreaker.half_open``)."""
        if self.breaker.open:
            self.breaker.half_open()

    # -- entering -------------------------------------------------------------------------

    async def _enter(self, ctx: Context, wait: Patience) -> Held:
        if self.breaker.open:
            reason = self.breaker.reason or breaker_reason(self.name)
            raise EffectRetry(Outcome(State.RETRYING, reason, stop_reason=reason))
        held = Held()
        counted = False

        def waiting() -> None:
            nonlocal counted
            if not counted:
                self.busy_waits += 1
                counted = True

        try:
            if self.local is not None:
                if self.local.locked():
                    waiting()
                    if await wait.until(self.local.acquire()) is STOPPED:
                        raise Busy(f"backend {self.name!r}: no free slot", backend=self.name)
                else:
                    await self.local.acquire()
                held.local = True
            if self.slots is not None:
                held.slot = await self._shared_slot(wait, waiting)
            if self.backend.ready is not None:
                await self._until_ready(ctx, wait, waiting)
            # A Retry-After holds every call back: longer than the patience left is busy.
            if self.limiter is not None and not await self.limiter.acquire(
                pause_limit_s=wait.left_s()
            ):
                waiting()
                hold = math.ceil(self.limiter.paused_s())
                raise Busy(f"backend {self.name!r} asked to wait {hold} s", hold, backend=self.name)
        except BaseException:
            await self._leave(held)
            raise
        self.calls += 1
        return held

    async def _shared_slot(self, wait: Patience, waiting: Callable[[], None]) -> Slot:
        assert self.slots is not None
        pause = SLOT_POLL_FIRST_S
        while True:
            slot = await self.slots.take()
            if slot is not None:
                return slot
            waiting()
            freed = self._freed
            await wait.until(freed.wait(), limit_s=pause)
            if wait.left_s() <= 0:
                raise Busy(f"backend {self.name!r}: every shared slot is held", backend=self.name)
            pause = min(SLOT_POLL_MAX_S, pause * 2)

    async def _until_ready(self, ctx: Context, wait: Patience, waiting: Callable[[], None]) -> None:
        while not await self._ask(ctx):
            waiting()
            assert self._asked_at is not None
            # The next answer is asked for once ready_every_s has passed since the last.
            pause = max(0.001, self._asked_at + self.backend.ready_every_s - self.clock())
            if not await wait.sleep(pause):
                raise Busy(f"backend {self.name!r} is not ready", backend=self.name)

    async def _ask(self, ctx: Context) -> bool:
        """Whether the backend is ready: the last answer while it is younger than
        ``ready_every_s`` and has served fewer than ``concurrency`` calls, else a new one
        (none sooner than ``ready_every_s`` after the last: False until then)."""
        async with self._probe_lock:
            now = self.clock()
            limit = self.backend.concurrency
            young = self._asked_at is not None and now - self._asked_at < self.backend.ready_every_s
            if young:
                if self._ready and (limit is None or self._uses < limit):
                    self._uses += 1
                    return True
                return False
            self._asked_at = now
            self._ready = await self._probe(ctx)
            self._uses = 1 if self._ready else 0
            return self._ready

    async def _probe(self, ctx: Context) -> bool:
        assert self.backend.ready is not None
        token = _INSIDE.set(_INSIDE.get() | {self.name})  # ctx.http reaches it directly
        try:
            answer: Any = self.backend.ready(ctx)
            if inspect.isawaitable(answer):
                answer = await asyncio.wait_for(answer, PROBE_TIMEOUT_S)
        except Exception as exc:  # a probe that fails says "not now"
            log.debug("backend %s: ready probe failed: %s: %s", self.name, type(exc).__name__, exc)
            return False
        finally:
            _INSIDE.reset(token)
        return bool(answer)

    # -- leaving --------------------------------------------------------------------------

    async def _leave(self, held: Held) -> None:
        if held.slot is not None:
            slot, held.slot = held.slot, None
            assert self.slots is not None
            await self.slots.release(slot)
            freed, self._freed = self._freed, asyncio.Event()
            freed.set()  # this process's waiters look at once
        if held.local:
            held.local = False
            assert self.local is not None
            self.local.release()

    def _busy(self, exc: Busy) -> None:
        """A busy answer: slow the rate, hold every call back its Retry-After, and take
        it as a fresh "not ready"."""
        self.throttles += 1
        self.busy_waits += 1
        if self.limiter is not None:
            self.limiter.throttled(exc.delay_s)
        if self.backend.ready is not None:
            self._asked_at, self._ready, self._uses = self.clock(), False, 0

    def _failed(self, exc: Exception) -> BaseException:
        """The verdict a known error means (an unknown one, a bug, as it is), the backend's
        breaker fed with a connection failure."""
        from batchrun.pipeline.outcomes import effect_outcome

        outcome = effect_outcome(exc)
        if outcome is None:
            return exc
        if outcome.connection:
            # Counted here, by the backend's own breaker, not the run's (mail's).
            if self.breaker.failure():
                reason = breaker_reason(self.name)
                self.breaker.reason = reason
                log.error(
                    "backend %r unreachable after %d connection failures in a row",
                    self.name,
                    self.breaker.consecutive,
                )
                outcome = replace(outcome, stop_reason=reason)
            outcome = replace(outcome, connection=False)
        else:
            self.breaker.success()
        return as_verdict(outcome)


__all__ = ["BackendGate", "Held", "breaker_reason", "inside"]

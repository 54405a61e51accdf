"""``batchrun.Backend``: an outside service a job calls, and what it can take.

    class Transcode(batchrun.Task):
        name = "transcode"
        backends = {"encoder": batchrun.Backend(concurrency=1, shared=True, ready=idle)}

        async def process(self, ctx, task):
            async with ctx.backend("encoder"):       # a call of the job's own
                ...
            # or: await ctx.http("encoder").post("/jobs", json=task.data)

A backend is declared once, on the job class (``Job.backends``), by name; the name is the
backend's everywhere: two jobs that name the same backend share its slots, its rate and
its breaker, and ``BATCHRUN_BACKEND_<NAME>_URL`` (``_RATE``, ``_CONCURRENCY``,
``_TIMEOUT_S``) configure it per deployment. What runs each call (the gate: breaker,
ready probe, slot, rate) is ``batchrun/policy/gate.py``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from batchrun.job import NAME

if TYPE_CHECKING:
    from batchrun.job import Context

Ready = Callable[["Context"], Awaitable[bool]]
Rate = float | Literal["auto"]


@dataclass(frozen=True, slots=True)
class Backend:
    """What one outside service can take; ``Job.backends`` names each.

    Args:
        concurrency: calls in flight at most (None: no cap). With ``shared``, across
            every process and Lambda, through slots in batchrun's database.
        rate: calls per second at most, or ``"auto"``: found by AIMD on 429 / 503
            answers (``Retry-After`` honoured). ``--rate`` caps it (the lower wins).
        shared: hold ``concurrency`` across processes (leases on the database server's
            clock, kept alive while a call runs; a dead process's slot is taken over once
            its lease ends). Needs ``concurrency``.
        ready: ``async (ctx) -> bool``, asked before a call: False (or an error) means
            busy, and the call waits. Inside it ``ctx.http(name)`` reaches the backend
            directly (no slot, no rate).
        ready_every_s: ask ``ready`` no more often than this. An answer is reused for
            this long, but never for more than ``concurrency`` calls: with
            ``concurrency=1`` every call asks afresh (the one task the backend runs may
            have started since).

    Busy (not ready, no slot, or an answer 429 / 503) is never a failure: a run waits,
    a consumer gives the entity back to its queue with a growing delay, no attempt
    counted.

    Raises:
        TypeError, ValueError: a figure that is not one (a concurrency below 1, a
            negative rate, ``shared`` without ``concurrency`` ...).
    """

    concurrency: int | None = None
    rate: Rate | None = None
    shared: bool = False
    ready: Ready | None = None
    ready_every_s: float = 1.0

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
                raise TypeError(f"concurrency must be an int, got {self.concurrency!r}")
            if self.concurrency < 1:
                raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.rate is not None and self.rate != "auto":
            if isinstance(self.rate, bool) or not isinstance(self.rate, int | float):
                raise TypeError(f"rate must be calls per second or 'auto', got {self.rate!r}")
            if not (math.isfinite(self.rate) and self.rate > 0):
                raise ValueError(f"rate must be a positive number or 'auto', got {self.rate!r}")
        if not isinstance(self.shared, bool):
            raise TypeError(f"shared must be True or False, got {self.shared!r}")
        if self.shared and self.concurrency is None:
            raise ValueError("shared=True needs a concurrency: the slots it shares")
        if self.ready is not None and not callable(self.ready):
            raise TypeError(f"ready must be an async function of ctx, got {self.ready!r}")
        every = self.ready_every_s
        if isinstance(every, bool) or not isinstance(every, int | float):
            raise TypeError(f"ready_every_s must be a number of seconds, got {every!r}")
        if not (math.isfinite(every) and every > 0):
            raise ValueError(f"ready_every_s must be a positive number, got {every!r}")

    def overridden(self, *, rate: Rate | None, concurrency: int | None) -> Backend:
        """This backend with a deployment's figures (``BATCHRUN_BACKEND_<NAME>_RATE``,
        ``_CONCURRENCY``) in place of its own, where given."""
        changes: dict[str, Any] = {}
        if rate is not None:
            changes["rate"] = rate
        if concurrency is not None:
            changes["concurrency"] = concurrency
        return replace(self, **changes) if changes else self


def env_prefix(name: str) -> str:
    """``BATCHRUN_BACKEND_<NAME>_``: the variables that configure backend ``name``."""
    return f"BATCHRUN_BACKEND_{name.upper().replace('-', '_')}_"


def check_backends(backends: object) -> str | None:
    """What is wrong with a job's ``backends`` (one line), or None."""
    if not isinstance(backends, Mapping):
        return f"backends must be a dict of name -> batchrun.Backend, got {backends!r}"
    for name, backend in backends.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            return f"backend name {name!r} does not match {NAME.pattern}"
        if not isinstance(backend, Backend):
            return f"backend {name!r} is not a batchrun.Backend: {backend!r}"
    return None


__all__ = ["Backend", "Rate", "Ready", "check_backends", "env_prefix"]

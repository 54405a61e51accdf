"""The named backends a runtime's jobs call (``Job.backends``): one gate per name for the
runtime's life (its breaker, rate and ready answers span runs and batches), made on first
use with the deployment's figures (``BATCHRUN_BACKEND_<NAME>_*``) and ``--rate``'s cap,
and ``ctx.http``'s clients, open while a run or a batch of messages uses them.

How ``--rate`` (``cap``) and a backend's own ``rate`` combine, the lower winning:

    backend rate    --rate R          --rate auto        no --rate
    N               min(N, R)         N                  N
    "auto"          auto up to R      auto               auto
    None            R                 auto               no rate

A number is a ceiling the rate never passes (a 429 / 503 still lowers it below); ``auto``
starts at ``AUTO_START`` calls/s and finds the backend's limit: it doubles every second
until the first busy answer (slow start), then grows by one call/s per second and drops
to 0.9 of itself on a busy answer. Halving, mail's law, would settle near 0.75 of the
limit; 0.9 settles near 0.95 of it, and with each busy answer's ``Retry-After`` pause
counted, some 0.9 of it is what the backend serves (``python -m bench.backend_rate``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from batchrun.errors import ConfigError
from batchrun.policy.gate import BackendGate
from batchrun.policy.pacing import CircuitBreaker
from batchrun.policy.rate import AdaptiveRate
from batchrun.policy.slots import SharedSlots

if TYPE_CHECKING:
    from batchrun.backend import Backend
    from batchrun.db.base import Database
    from batchrun.job import Context, Job
    from batchrun.settings import Settings

log = logging.getLogger(__name__)

AUTO_START = 10.0  # where a backend's auto rate starts (it doubles each second from there)
BACKEND_DECREASE = 0.9  # what a busy answer multiplies an adaptive backend rate by

Cap = float | Literal["auto"] | None


class BackendPool:
    """The backends of one runtime's jobs, by name.

    Args:
        settings: the overrides (``Settings.backend``), the lease of shared slots, the
            breaker threshold.
        db: batchrun's database, for shared slots (None: no shared backend can be used).
    """

    def __init__(self, settings: Settings, db: Database | None) -> None:
        self.settings = settings
        self.db = db
        self.cap: Cap = None  # --rate of the runs and drains, set before their calls
        self.gates: dict[str, BackendGate] = {}
        self._declared: dict[str, Backend] = {}
        self._clients: dict[str, Any] = {}  # name -> httpx.AsyncClient, during sessions
        self._sessions = 0

    def declare(self, job: Job) -> None:
        """Know ``job``'s backends, and check their figures from the environment (a bad
        variable is a ``ConfigError`` naming it, before any call)."""
        for name, backend in job.backends.items():
            known = self._declared.get(name)
            if known is not None and known != backend:
                log.warning(
                    "backend %r is declared differently by job %s: the first declaration holds",
                    name,
                    job.name,
                )
                continue
            self._declared[name] = backend
            self.settings.backend(name)

    def gate(self, job: Job, name: str) -> BackendGate:
        """The gate of backend ``name``, which ``job`` declares; made on first use."""
        found = self.gates.get(name)
        if found is not None:
            return found
        if name not in job.backends:
            declared = ", ".join(repr(n) for n in job.backends) or "none"
            raise LookupError(
                f"job {job.name!r} declares no backend {name!r} (Job.backends: {declared})"
            )
        self.declare(job)
        backend = self._declared[name]
        figures = self.settings.backend(name)
        backend = backend.overridden(rate=figures.rate, concurrency=figures.concurrency)
        if backend.shared and backend.concurrency is None:
            raise ConfigError(f"backend {name!r} is shared and has no concurrency")
        slots = None
        if backend.shared:
            if self.db is None:
                raise ConfigError(f"backend {name!r} is shared: it needs batchrun's database")
            assert backend.concurrency is not None
            slots = SharedSlots(self.db, name, backend.concurrency, lease_s=self.settings.lease_s)
        found = BackendGate(
            name,
            backend,
            limiter=limiter(backend.rate, self.cap),
            breaker=CircuitBreaker(self.settings.breaker_threshold),
            slots=slots,
        )
        self.gates[name] = found
        return found

    def call(self, ctx: Context, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """``ctx.backend(name)``."""
        return self.gate(ctx.job, name).call(ctx)

    def http(self, ctx: Context, name: str) -> Any:
        """``ctx.http(name)``: the backend's client, made on first use in a session."""
        client = self._clients.get(name)
        if client is None:
            from batchrun.effects.http import make_client

            gate = self.gate(ctx.job, name)
            figures = self.settings.backend(name)
            if figures.url is None:
                raise ConfigError(
                    f"ctx.http({name!r}) needs the backend's base URL: set "
                    f"BATCHRUN_BACKEND_{name.upper().replace('-', '_')}_URL"
                )
            client = make_client(gate, ctx, figures.url, figures.timeout_s or 10.0)
            if self._sessions == 0:
                log.warning("ctx.http(%r) outside a run: its client is never closed", name)
            self._clients[name] = client
        return client

    @contextlib.asynccontextmanager
    async def session(self, cap: Cap = None) -> AsyncIterator[None]:
        """A run or a batch of messages: ``--rate`` for gates made now; ``ctx.http``'s
        clients are closed when the last session ends (they belong to this event loop)."""
        if cap is not None:
            self.cap = cap
        self._sessions += 1
        try:
            yield
        finally:
            self._sessions -= 1
            if self._sessions == 0:
                await self.close_clients()

    async def close_clients(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every gate's figures now (what ``figures`` subtracts)."""
        return {name: gate.figures() for name, gate in self.gates.items()}

    def figures(
        self,
        names: Mapping[str, object] | None = None,
        since: dict[str, dict[str, Any]] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """``{name: {calls, throttles, busy_waits, rate}}`` since ``since`` (a snapshot),
        for the backends ``names`` lists (default: every one used), 0 for one not used."""
        wanted = list(names) if names is not None else list(self.gates)
        shown: dict[str, dict[str, Any]] = {}
        for name in wanted:
            gate = self.gates.get(name)
            now = gate.figures() if gate is not None else _unused()
            before = (since or {}).get(name, _unused())
            shown[name] = {
                key: now[key] - before.get(key, 0) if key != "rate" else now[key] for key in now
            }
        return shown

    def half_open(self) -> None:
        """Let one call through every open breaker (a worker after its outage pause)."""
        for gate in self.gates.values():
            gate.half_open()


def _unused() -> dict[str, Any]:
    return {"calls": 0, "throttles": 0, "busy_waits": 0, "rate": None}


def limiter(own: Cap, cap: Cap) -> AdaptiveRate | None:
    """A backend's pace from its own rate and ``--rate`` (see the module's table)."""
    numbers = [r for r in (own, cap) if isinstance(r, int | float)]
    if own == "auto" or (own is None and cap == "auto"):
        ceiling = min(numbers) if numbers else None
        start = min(ceiling, AUTO_START) if ceiling is not None else AUTO_START
        return _adaptive(start, ceiling, slow_start=True)
    if numbers:
        rate = float(min(numbers))
        return _adaptive(rate, rate, slow_start=False)
    return None


def _adaptive(start: float, ceiling: float | None, *, slow_start: bool) -> AdaptiveRate:
    return AdaptiveRate(
        start,
        ceiling=ceiling,
        floor=min(0.5, start),
        decrease=BACKEND_DECREASE,
        slow_start=slow_start,
    )


__all__ = ["AUTO_START", "BackendPool", "limiter"]

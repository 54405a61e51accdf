"""``ctx.http(name)``: an ``httpx.AsyncClient`` whose every request goes through the
backend's gate (``policy/gate.py``), the way httpx lets a transport wrap another.

httpx is an optional dependency (``pip install 'batchrun[http]'``): this module is imported
only when a job calls ``ctx.http``, so a deployment without it never imports httpx.

An answer 429 or 503 is busy: the transport reads it, lets it go and raises ``Busy`` (its
``Retry-After`` as the delay), so the job never sees it as a response. Any other answer
comes back as it is; ``raise_for_status()`` turns the rest into errors batchrun
classifies. The slot a request holds is let go once the response's headers are in (httpx
reads a body the client was not asked to stream right after).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchrun.errors import ConfigError
from batchrun.pipeline.outcomes import busy_response
from batchrun.policy.gate import inside

if TYPE_CHECKING:
    from batchrun.job import Context
    from batchrun.policy.gate import BackendGate

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the dev extra has it
    raise ConfigError(
        f"ctx.http needs httpx ({exc.name} is missing): pip install 'batchrun[http]'"
    ) from None


class GatedTransport(httpx.AsyncBaseTransport):
    """Each request through ``gate``: a slot, ``ready``, the rate, the breaker."""

    def __init__(self, gate: BackendGate, ctx: Context, inner: httpx.AsyncBaseTransport) -> None:
        self.gate = gate
        self.ctx = ctx  # the ready probe's context
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if inside(self.gate.name):  # ready itself, or a job's ``async with ctx.backend``
            return await self.inner.handle_async_request(request)
        async with self.gate.call(self.ctx):
            response = await self.inner.handle_async_request(request)
            busy = busy_response(_with_request(response, request), self.gate.name)
            if busy is not None:
                await response.aclose()
                raise busy
            return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _with_request(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    response.request = request  # what the client sets later: the reason names the URL
    return response


def make_client(gate: BackendGate, ctx: Context, base_url: str, timeout_s: float) -> Any:
    """The backend's client: ``base_url``, ``timeout_s`` for each request, its pool sized
    to the backend's concurrency."""
    limit = gate.backend.concurrency
    limits = httpx.Limits(max_connections=max(100, limit or 0), max_keepalive_connections=20)
    inner = httpx.AsyncHTTPTransport(limits=limits)
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout_s,
        transport=GatedTransport(gate, ctx, inner),
    )


__all__ = ["GatedTransport", "make_client"]

"""credits: grant each active customer this month's credit through the credits HTTP API.

``POST /grants`` grants again on every call, so exactly-once rests on the application's
``credit_grant`` table, UNIQUE on the key: a rerun that finds the key's row does not call
again; otherwise the call carries ``Idempotency-Key: ctx.key`` and its grant id is recorded
with an insert-ignore. Left open: a crash or timeout after the API granted and before that
insert; the retry calls again with the same key, which only an API honouring it can drop.
Configuration, from the environment batchrun was configured from (``ctx.env``: the CLI's,
or the one the Lambda handler is given): ``CREDITS_API_URL`` (http://127.0.0.1:8080),
``CREDITS_API_TIMEOUT_S`` (10).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

import batchrun

CREDITS = {"starter": 100, "pro": 500, "team": 2000}  # monthly credit by plan


class MonthlyCredits(batchrun.Job):
    """One credit grant per active customer and month, recorded in ``credit_grant``."""

    name = "credits"
    period = "month"
    description = "Grant each active customer a monthly credit through the credits API"
    sql = batchrun.SqlFolder.beside(__file__)
    requires = {
        "customer": ("id", "email", "plan", "active"),
        "credit_grant": ("idempotency_key", "customer_id", "amount", "api_grant_id"),
    }

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = environ  # None: ctx.env, read when the client is made
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        return await ctx.db.fetch(ctx.sql("page"), after=after, limit=limit)

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        if await ctx.db.fetch(ctx.sql("grant_for_key"), key=ctx.key):
            return  # granted and recorded before; only batchrun's ledger missed it
        amount = CREDITS.get(row["plan"])
        if amount is None:
            raise batchrun.Skip(f"no monthly credit for plan {row['plan']!r}")
        grant = {"key": ctx.key, "customer_id": row["id"], "amount": amount}
        grant["api_grant_id"] = await self._grant(ctx, row["id"], amount)
        if await ctx.db.execute(ctx.sql("record_grant"), **grant):  # 0: recorded already
            ctx.count("credits_granted")

    async def _grant(self, ctx: batchrun.Context, customer_id: int, amount: int) -> str:
        body = {"customer_id": customer_id, "amount": amount, "period": str(ctx.period)}
        # Through the run's pacer (--rate, the breaker): an httpx error leaving the block is
        # the verdict it means (429 -> Retry after its Retry-After, 5xx/408/timeouts/
        # connection errors -> Retry, other 4xx -> Fail).
        async with ctx.paced():
            response = await self.client(ctx.env).post(
                "/grants", json=body, headers={"Idempotency-Key": ctx.key}
            )
            response.raise_for_status()
        try:
            grant_id = response.json()["id"]
        except (ValueError, KeyError, TypeError):
            grant_id = None
        if not isinstance(grant_id, str | int) or grant_id == "":
            # It answered success, so the credit may exist: a retry could grant it twice.
            raise batchrun.Fail(f"credits API answered {response.status_code} without a grant id")
        return str(grant_id)

    def client(self, env: Mapping[str, str] | None = None) -> httpx.AsyncClient:
        """The job's one client, made on first use in the running event loop, configured
        from the job's own ``environ`` if it was given one, else from ``env`` (``ctx.env``)."""
        loop = asyncio.get_running_loop()
        # A client's connections belong to the loop that opened them: a warm Lambda runs
        # each invocation in a new loop, so a new loop gets a new client.
        if self._client is None or self._loop is not loop:
            config = self.environ if self.environ is not None else env or {}
            self._client = httpx.AsyncClient(
                base_url=config.get("CREDITS_API_URL", "http://127.0.0.1:8080"),
                timeout=float(config.get("CREDITS_API_TIMEOUT_S", "10")),
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the client (its pooled connections)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

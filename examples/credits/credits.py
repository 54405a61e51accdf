"""credits: grant each active customer this month's credit through the credits HTTP API.

``POST /grants`` grants again on every call, so exactly-once rests on the application's
``credit_grant`` table, UNIQUE on the key: a rerun that finds the key's row does not call
again; otherwise the call carries ``Idempotency-Key: ctx.key`` and its grant id is recorded
with an insert-ignore. Left open: a crash or timeout after the API granted and before that
insert; the retry calls again with the same key, which only an API honouring it can drop.

The API is the job's backend ``credits`` (``ctx.http("credits")``): its calls go at the
rate it finds by itself (``rate="auto"``: AIMD on 429 and 503, ``Retry-After`` honoured;
``--rate R`` caps it), a 429 or 503 is busy, not a failure (the run waits and calls
again, no attempt counted), and connection failures in a row open its breaker, which
stops the run and queues the rest. Its base URL is ``BATCHRUN_BACKEND_CREDITS_URL``, its
timeout ``BATCHRUN_BACKEND_CREDITS_TIMEOUT_S`` (10 s).
"""

from __future__ import annotations

from typing import Any

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
    backends = {"credits": batchrun.Backend(rate="auto")}

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
        response = await ctx.http("credits").post(
            "/grants", json=body, headers={"Idempotency-Key": ctx.key}
        )
        response.raise_for_status()  # 5xx, 408: Retry; any other 4xx: Fail
        try:
            grant_id = response.json()["id"]
        except (ValueError, KeyError, TypeError):
            grant_id = None
        if not isinstance(grant_id, str | int) or grant_id == "":
            # It answered success, so the credit may exist: a retry could grant it twice.
            raise batchrun.Fail(f"credits API answered {response.status_code} without a grant id")
        return str(grant_id)

"""A job for the lost-reply tests: credit each account 10 once per month, in one UPDATE.

The UPDATE itself is not idempotent (``balance = balance + 10``): run twice, it credits
twice. The job's own key makes a retry of the whole entity safe: ``process`` first reads
whether the account already carries this period's key, and the UPDATE records the key
with the credit in the same statement. So batchrun must never run the UPDATE again alone
(a lost reply), and may always retry the entity.
"""

from __future__ import annotations

from typing import Any

import batchrun

TABLE = {
    "mysql": "CREATE TABLE account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, "
    "credited VARCHAR(100) NULL)",
    "postgresql": "CREATE TABLE account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, "
    "credited VARCHAR(100) NULL)",
    "sqlite": "CREATE TABLE account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL DEFAULT 0, "
    "credited TEXT NULL)",
}
CREDIT = "UPDATE account SET balance = balance + 10, credited = :key WHERE id = :id"


class Credit(batchrun.Job):
    """Ten credits per account and month."""

    name = "credit"
    period = "month"
    description = "credit each account 10 (lost-reply tests)"
    requires = {"account": ("id", "balance", "credited")}

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        return await ctx.db.fetch(
            "SELECT id FROM account WHERE id > :after ORDER BY id LIMIT :limit",
            after=after,
            limit=limit,
        )

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        found = await ctx.db.fetch("SELECT credited FROM account WHERE id = :id", id=row["id"])
        if found and found[0]["credited"] == ctx.key:
            return  # credited by an attempt whose reply was lost
        await ctx.db.execute(CREDIT, key=ctx.key, id=row["id"])

"""renewal: remind each active account, by email, a week before its plan renews.

Run for a day (``--period 2025-06-01``), it selects the accounts whose ``renews_on`` is
seven days later. batchrun's ledger makes the reminder happen once per account and day,
whatever runs overlap, crash or retry; the email is the ``renewal`` template beside this
file (``templates/renewal/``), which ``--templates DIR`` can override.

Schema (the application's own, created by ``batchrun db migrate`` only when missing):
``account(id, contact, name, renews_on DATE, active)``, with an index on
``(renews_on, active, id)`` so every page is one index range.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import batchrun

NOTICE = dt.timedelta(days=7)


class RenewalReminder(batchrun.Job):
    """One email per active account whose plan renews a week after the run's day."""

    name = "renewal"
    period = "day"
    description = "Remind accounts a week before their plan renews"
    sql = batchrun.SqlFolder.beside(__file__)
    requires = {"account": ("id", "contact", "name", "renews_on", "active")}

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        # ISO text, not a date object: SQLite stores dates as 'YYYY-MM-DD', MySQL compares
        # a DATE column to that text through the index, and Python 3.12 deprecates
        # sqlite3's implicit date adapter.
        day = renews_on(ctx).isoformat()
        return await ctx.db.fetch(ctx.sql("page"), day=day, after=after, limit=limit)

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        if not row["email"]:
            raise batchrun.Skip("no address")
        await ctx.send_email(
            to=row["email"],
            to_name=row["name"],
            template="renewal",
            name=row["name"],
            renews_on=renews_on(ctx),
        )


def renews_on(ctx: batchrun.Context) -> dt.date:
    """The renewal day a run for ``ctx.period`` reminds of."""
    return ctx.period.start + NOTICE

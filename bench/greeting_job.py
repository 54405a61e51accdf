"""greeting: the bench's user-defined job, one plain email per user, nothing else.

What a team would write on batchrun's public API in a few lines and load with
``--jobs bench/greeting_job.py``: the same users as the birthday job (active, with an
address, born in the run's month, over the same index), but no gift card, no ``prepare``
and no template, only ``ctx.send_email`` with a subject and a text. ``bench/run.py``
measures it beside the built-in birthday job, against the same database, sink and
concurrency, so the difference between the two is the birthday job's own work (cards,
the Jinja2 template, a larger message), not the runtime's.

    batchrun --db mysql://... --mail smtp://... --jobs bench/greeting_job.py \\
        run greeting --period 2025-06 --concurrency 200 --json
"""

from __future__ import annotations

from typing import Any

import batchrun

# A keyset page over the birthday job's index idx_user_birth_month_status_id (the
# birth_month column and its index come from `batchrun db migrate`); FORCE INDEX as the
# birthday job's page has it (MariaDB would take ref on the month's early pages).
PAGE = """
SELECT id, first_name, last_name, email
FROM `user` FORCE INDEX (idx_user_birth_month_status_id)
WHERE birth_month = :month AND status = 10 AND id > :after AND email IS NOT NULL
ORDER BY id
LIMIT :limit
"""


class Greeting(batchrun.Job):
    """One short text email to every active user born in the month."""

    name = "greeting"
    period = "month"
    description = "A plain text greeting to the month's active users (bench)"
    requires = {"user": ("id", "first_name", "last_name", "email", "birth_month", "status")}

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        return await ctx.db.fetch(PAGE, month=ctx.period.month, after=after, limit=limit)

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        # An invalid address makes send_email raise Skip, as for the birthday job.
        first = row["first_name"] or "there"
        await ctx.send_email(
            to=row["email"],
            to_name=" ".join(p for p in (row["first_name"], row["last_name"]) if p),
            subject=f"Hello {first}",
            text=f"Hello {first},\n\nthis is a short note for {ctx.period}.\n\nBest wishes\n",
        )

"""The birthday job: every active user born in the month gets one gift card for the year
and one birthday email. Written on batchrun's public API only, like any job of yours.

Exactly-once rests on the database: the ledger serializes work on a user, and
``gift_card.idempotency_key`` (``ctx.key``, e.g. ``birthday:2025:42``) is UNIQUE, so
overlapping runs, crashes and retries can never create a second card.
"""

from __future__ import annotations

from typing import Any

import batchrun
from batchrun import Context, SqlFolder, valid_address
from batchrun.jobs.birthday import codes as gift_codes

CARD_STATUS = 1
ACTIVE = 10


class Birthday(batchrun.Job):
    """Pages of users born in the month -> their cards (``prepare``) -> one email each."""

    name = "birthday"
    period = "month"
    once_per = "year"
    description = "A gift card for the year and a birthday email for users born in the month"
    sql = SqlFolder.beside(__file__)
    counters = ("cards_created",)
    sender = "birthday@localhost"  # --from (BATCHRUN_FROM) sets a deployment's own
    status_names = {"cards": "cards", "succeeded": "emails_sent"}  # batchrun 0.1's status
    requires = {
        "user": ("id", "first_name", "last_name", "email", "date_of_birth", "status"),
        "gift_card": ("recipient_email", "message", "status", "scheduled_at", "gift_code"),
    }

    async def page(self, ctx: Context, after: int, limit: int) -> list[dict[str, Any]]:
        return await ctx.db.fetch(ctx.sql("page"), month=ctx.period.month, after=after, limit=limit)

    async def prepare(self, ctx: Context, rows: list[dict[str, Any]]) -> None:
        """Ensure every valid user of the page has a card (one multi-row insert-ignore);
        a suppressed address gets none."""
        users = [r for r in rows if valid_address(r["email"])]
        suppressed = await ctx.suppressed([r["email"] for r in users])
        users = [r for r in users if r["email"] not in suppressed]
        if not users:
            return
        prefix = f"{self.name}:{ctx.once}:"
        message = ctx.env.get("BATCHRUN_CARD_MESSAGE") or "Happy birthday!"
        scheduled = f"{ctx.period.start.isoformat()} 00:00:00"
        todo = users
        for _ in range(5):  # a gift-code collision (80 bits) is retried with a fresh code
            fresh = gift_codes.new_codes(len(todo))
            inserted = await ctx.db.execute(
                ctx.sql("insert_cards"),
                rows=[
                    (r["email"], message, CARD_STATUS, scheduled, code, prefix + str(r["id"]))
                    for r, code in zip(todo, fresh, strict=True)
                ],
            )
            if inserted == len(todo):
                # Every card is new: the codes are ours, nothing to read back.
                for row, code in zip(todo, fresh, strict=True):
                    row["code"] = code
                ctx.count("cards_created", inserted)
                return
            found = await ctx.db.fetch(
                ctx.sql("cards_by_key"), keys=[prefix + str(r["id"]) for r in todo]
            )
            codes = {str(c["idempotency_key"]): str(c["gift_code"]) for c in found}
            missing = []
            for row, code in zip(todo, fresh, strict=True):
                existing = codes.get(prefix + str(row["id"]))
                if existing is None:
                    missing.append(row)
                    continue
                row["code"] = existing
                ctx.count("cards_created", int(existing == code))
            if not missing:
                return
            todo = missing
        for row in todo:
            row["code"] = None  # five collisions in a row: try again later

    async def process(self, ctx: Context, row: dict[str, Any]) -> None:
        if not valid_address(row["email"]):
            raise batchrun.Skip("invalid email address")
        reason = (await ctx.suppressed([row["email"]])).get(row["email"])
        if reason is not None:  # before the card check: prepare made none
            raise batchrun.Skip(f"suppressed: {reason}")
        if "code" not in row and ctx.dry_run:  # batchrun preview: prepare did not run
            found = await ctx.db.fetch(ctx.sql("cards_by_key"), keys=[ctx.key])
            row["code"] = str(found[0]["gift_code"]) if found else "0" * gift_codes.LENGTH
        if row.get("code") is None:
            raise batchrun.Retry("could not create a unique gift code")
        redeem = ctx.env.get("BATCHRUN_REDEEM_URL")
        code = gift_codes.display(row["code"])
        await ctx.send_email(
            to=row["email"],
            to_name=" ".join(p for p in (row["first_name"], row["last_name"]) if p).strip(),
            template="birthday",
            first_name=row["first_name"] or "",
            last_name=row["last_name"] or "",
            code=code,
            year=ctx.period.year,
            redeem_url=redeem.replace("{code}", row["code"]) if redeem else None,
            postal_address=ctx.env.get("BATCHRUN_POSTAL_ADDRESS") or None,
        )

    async def seed(
        self, ctx: Context, count: int, *, seed: int = 1, force: bool = False
    ) -> list[str]:
        """``db seed``: demo users (a few inactive, a few without or with invalid addresses)."""
        from batchrun.jobs.birthday import demo

        added = await demo.seed_users(ctx.db, count, seed=seed, force=force)
        samples = await demo.sample_ids(ctx.db)
        shown = "; ".join(
            f"{m:02d}: {', '.join(map(str, ids))}" for m, ids in samples.items() if ids
        )
        # Ids that exist, for `batchrun preview birthday --period 2025-MM --id N`.
        return [f"added {added} users", f"eligible ids by month (for `preview --id`): {shown}"]

    async def explain(self, ctx: Context) -> batchrun.job.Explained:
        """``db explain``: the page query's plan without its index hint, and whether the
        database reads the month through idx_user_birth_month_status_id."""
        from batchrun.jobs.birthday import demo, explain

        rows = await demo.explain(ctx.db, ctx.period)
        line = explain.verdict(ctx.db.dialect, rows)
        if ctx.db.dialect == "postgresql" and not line.startswith("ok:"):
            (found,) = await ctx.db.fetch(ctx.sql("index_and_rows"))
            line = explain.postgresql_index_unused(
                line, bool(found["has_index"]), int(found["estimate"]), int(found["bytes"])
            )
        return [("the birthday page query", rows)], line

    async def status(self, ctx: Context) -> dict[str, int]:
        """Cards of the month, and users still to do (never touched, claimed or retrying)."""
        cards = await ctx.db.fetch(ctx.sql("status_cards"), job=self.name, period=str(ctx.period))
        pending = await ctx.db.fetch(
            ctx.sql("status_pending"), job=self.name, once=str(ctx.once), month=ctx.period.month
        )
        return {"cards": _count(cards), "pending": _count(pending)}


def _count(rows: list[dict[str, Any]]) -> int:
    return int(next(iter(rows[0].values()))) if rows else 0

"""The birthday job's demo data and diagnostics: ``db seed`` and ``db explain``."""

from __future__ import annotations

import random
from datetime import date
from typing import Any

from batchrun.job import ContextDb
from batchrun.jobs.birthday.job import Birthday
from batchrun.period import Period

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Ken", "Linus", "Margaret", "Dennis",
         "Frances", "Zoë", "José", "Chloé", "Søren", "Björk", "李"]  # fmt: skip
LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Thompson", "Torvalds",
        "Hamilton", "Ritchie", "Allen", "Müller", "García", "O'Brien", "Nakamura"]  # fmt: skip


class NotEmptyError(ValueError):
    """The user table already has users."""


async def seed_users(db: ContextDb, count: int, *, seed: int, force: bool = False) -> int:
    """Insert ``count`` deterministic demo users; refuse a non-empty table unless forced.

    A few are inactive, have no address or an invalid one, as in real data.
    """
    sql = Birthday.sql
    assert sql is not None
    if not force and await db.fetch(sql.text(db.dialect, "any_user")):
        raise NotEmptyError("the user table is not empty: refusing to add demo users (use --force)")
    rng = random.Random(seed)
    last_row = await db.fetch(sql.text(db.dialect, "last_user"))
    start = int(next(iter(last_row[0].values())) or 0) if last_row else 0
    inserted = 0
    batch: list[tuple[Any, ...]] = []
    for i in range(count):
        n = start + i + 1
        born = date(rng.randint(1950, 2006), rng.randint(1, 12), rng.randint(1, 28))
        roll = rng.random()
        status = 0 if roll < 0.05 else 10  # a few inactive users
        if roll > 0.995:
            email: str | None = f"broken{n}@"  # a few invalid addresses
        elif 0.05 <= roll < 0.06:
            email = None
        else:
            email = f"user{n}.{rng.randrange(10**6):06d}@example.com"
        batch.append((rng.choice(FIRST), rng.choice(LAST), email, born.isoformat(), status))
        if len(batch) == 1000:
            inserted += await db.execute(sql.text(db.dialect, "insert_users"), rows=batch)
            batch = []
    if batch:
        inserted += await db.execute(sql.text(db.dialect, "insert_users"), rows=batch)
    return inserted


async def explain(db: ContextDb, period: Period) -> list[dict[str, Any]]:
    """The plan of the page query, as the database reports it."""
    sql = Birthday.sql
    assert sql is not None
    return await db.fetch(
        sql.text(db.dialect, "explain_page"), month=period.month, after=0, limit=500
    )


async def sample_ids(db: ContextDb, per_month: int = 3) -> dict[int, list[int]]:
    """The first ``per_month`` eligible user ids of each month (for ``preview --id``)."""
    sql = Birthday.sql
    assert sql is not None
    found: dict[int, list[int]] = {}
    for month in range(1, 13):
        rows = await db.fetch(sql.text(db.dialect, "page"), month=month, after=0, limit=per_month)
        found[month] = [int(row["id"]) for row in rows]
    return found

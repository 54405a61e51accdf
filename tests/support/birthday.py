"""The birthday job's data in tests: demo users, what its month should reach, its cards
and its status."""

from __future__ import annotations

from types import SimpleNamespace

from batchrun.db import Store
from batchrun.db.store import Scope
from batchrun.jobs.birthday import demo
from batchrun.period import Period
from batchrun.runtime import Runtime
from support.db import query


async def seed_users(store: Store, count: int, *, seed: int = 1, force: bool = False) -> int:
    """The birthday job's demo users (``batchrun db seed``)."""
    return await demo.seed_users(store.jobdb, count, seed=seed, force=force)


async def seed(store: Store, count: int, *, seed: int = 7) -> None:
    await seed_users(store, count, seed=seed)


async def status_of(runtime: Runtime, period: Period, problems: int = 50) -> SimpleNamespace:
    """What `batchrun status` reports for the birthday job: cards, emails_sent, pending ..."""
    counts = await runtime.status("birthday", period, problems=problems)
    return SimpleNamespace(emails_sent=counts["succeeded"], **counts)


def birthday_scope(year: int = 2025, month: int = 6) -> Scope:
    """The ledger scope of the birthday job's month."""
    return Scope("birthday", f"{year:04d}", f"{year:04d}-{month:02d}")


def eligible_ids(db_url: str, month: int) -> set[int]:
    """Users the job must reach: active, born in the month, with an address."""
    rows = query(
        db_url,
        "SELECT id FROM user WHERE birth_month = %s AND status = 10 AND email IS NOT NULL",
        month,
    )
    return {int(r[0]) for r in rows}


def card_counts(db_url: str, year: int) -> dict[int, int]:
    """user id -> number of this job's cards for ``year``."""
    rows = query(
        db_url,
        "SELECT idempotency_key FROM gift_card WHERE idempotency_key LIKE %s",
        f"birthday:{year}:%",
    )
    counts: dict[int, int] = {}
    for (key,) in rows:
        uid = int(str(key).rsplit(":", 1)[1])
        counts[uid] = counts.get(uid, 0) + 1
    return counts

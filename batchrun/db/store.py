"""The store: every database operation batchrun needs, written once for every dialect."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from enum import IntEnum
from typing import Any

from batchrun.db.base import Database, Row
from batchrun.db.sql import Statement, migration_steps
from batchrun.errors import DatabaseError, NotMigratedError


class State(IntEnum):
    """A user's state in the ledger for one (job, year)."""

    PENDING = 0  # claimed or released, not finished
    SENT = 1
    SKIPPED = 2  # invalid address: never retried
    RETRYING = 3  # failed temporarily, waiting in the retry queue
    FAILED = 4  # failed for good (permanent error or out of attempts)


FINAL_STATES = frozenset({State.SENT, State.SKIPPED, State.FAILED})
MAX_ID = 2**63 - 1  # the largest id a BIGINT column (and SQLite's INTEGER) can hold


def now_ms() -> int:
    """Wall-clock epoch milliseconds (leases compare across processes and hosts)."""
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A user the page query returned, with its ledger row if it has one."""

    user_id: int
    first_name: str | None
    last_name: str | None
    email: str
    state: int | None
    owner: str | None
    lease_until: int | None


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds a user's ledger row now."""

    user_id: int
    state: int
    owner: str | None
    lease_until: int | None


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """What `batchrun status` reports from the database."""

    cards: int
    emails_sent: int
    pending: int
    skipped: int
    retrying: int
    failed_permanent: int
    problems: list[tuple[int, int, int, str | None]]


class Store:
    """Job-level operations over a Database; one instance per job name."""

    def __init__(self, db: Database, *, job: str = "birthday") -> None:
        self.db = db
        self.job = job
        # owner -> (year, the user ids it holds): what the heartbeat must keep alive
        self._held: dict[str, tuple[int, set[int]]] = {}

    # -- schema ---------------------------------------------------------------------------

    async def migrate(self) -> list[str]:
        """Run every step whose guard does not hold yet; return the names of the steps run.

        Guards, not the record in batchrun_schema, decide: a dropped batchrun table is
        recreated, and a second run on a complete schema changes nothing at all.
        """
        applied: list[str] = []
        for step in migration_steps(self.db.dialect):
            if not await self._step_done(step):
                await self.db.run_step(step)
                applied.append(step.name)
                await self.db.execute("schema_record", step=step.name, now=now_ms())
        return applied

    async def check_migrated(self) -> None:
        """Raise NotMigratedError unless every schema step's guard holds."""
        missing = [
            step.name
            for step in migration_steps(self.db.dialect)
            if not await self._step_done(step)
        ]
        if missing:
            raise NotMigratedError(
                f"database {self.db.url} is missing part of batchrun's schema "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
                "run `batchrun db migrate`"
            )

    async def _step_done(self, step: Statement) -> bool:
        for guard in step.unless:
            if await self.db.guard_holds(guard):
                return True
        return False

    async def explain(self, *, year: int, month: int) -> list[Row]:
        """The plan of the page query, as the database reports it."""
        prefix = self.db.queries.statements["explain_prefix"].text
        page = self.db.queries.statements["eligible_page"]
        params = {
            "job": self.job,
            "year": year,
            "month": month,
            "after": 0,
            "until": MAX_ID,
            "limit": 500,
        }
        sql, args = self.db.queries.compile_text("explain", f"{prefix} {page.text}", params)
        return await self.db.fetch_sql(sql, args)

    # -- users ----------------------------------------------------------------------------

    async def month_started(self, *, year: int, month: int) -> bool:
        """Whether any ledger row exists for the month (a run has been at it)."""
        row = await self.db.fetchone("month_started", job=self.job, year=year, month=month)
        return row is not None

    async def eligible_page(
        self,
        *,
        year: int,
        month: int,
        after: int,
        limit: int,
        until: int = MAX_ID,
        fresh: bool = False,
    ) -> list[Candidate]:
        """The next keyset page of unfinished users born in ``month``, ids in (after, until].

        ``fresh``: the month had no ledger rows when the run began, so the page skips the
        ledger join; claiming still sorts out whatever other runs did meanwhile.
        """
        params = {
            "job": self.job,
            "year": year,
            "month": month,
            "after": after,
            "until": until,
            "limit": limit,
        }
        if fresh:
            rows = await self.db.fetchall("eligible_page_fresh", **params)
        else:
            rows = await self.db.fetchall("eligible_page", **params)
        return [Candidate(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]

    async def eligible_ids(self, *, year: int, month: int, after: int, limit: int) -> list[int]:
        """The next keyset page of unfinished users' ids only (the fan-out producer's walk)."""
        rows = await self.db.fetchall(
            "eligible_ids_page", job=self.job, year=year, month=month, after=after, limit=limit
        )
        return [int(r[0]) for r in rows]

    async def users_by_id(self, ids: Sequence[int]) -> dict[int, Row]:
        """id -> (id, first_name, last_name, email, status, birth_month)."""
        if not ids:
            return {}
        rows = await self.db.fetchall("users_by_id", ids=list(ids))
        return {int(r[0]): r for r in rows}

    async def seed_users(self, count: int, *, seed: int, force: bool = False) -> int:
        """Insert ``count`` deterministic demo users; refuse a non-empty table unless forced."""
        if not force and await self.db.fetchone("any_user") is not None:
            raise DatabaseError(
                "the user table is not empty: refusing to add demo users (use --force)"
            )
        rng = random.Random(seed)
        first = [
            "Ada",
            "Grace",
            "Alan",
            "Edsger",
            "Barbara",
            "Ken",
            "Linus",
            "Margaret",
            "Dennis",
            "Frances",
            "Zoë",
            "José",
            "Chloé",
            "Søren",
            "Björk",
            "李",
        ]
        last = [
            "Lovelace",
            "Hopper",
            "Turing",
            "Dijkstra",
            "Liskov",
            "Thompson",
            "Torvalds",
            "Hamilton",
            "Ritchie",
            "Allen",
            "Müller",
            "García",
            "O'Brien",
            "Nakamura",
        ]
        inserted = 0
        batch: list[tuple[Any, ...]] = []
        start = await self.db.fetchval("any_user") or 0
        for i in range(count):
            n = int(start) + i + 1
            born = date(rng.randint(1950, 2006), rng.randint(1, 12), rng.randint(1, 28))
            roll = rng.random()
            status = 0 if roll < 0.05 else 10  # a few inactive users
            if roll > 0.995:
                email: str | None = f"broken{n}@"  # a few invalid addresses, as in real data
            elif 0.05 <= roll < 0.06:
                email = None
            else:
                email = f"user{n}.{rng.randrange(10**6):06d}@example.com"
            batch.append((rng.choice(first), rng.choice(last), email, born.isoformat(), status))
            if len(batch) == 1000:
                inserted += await self.db.execute("insert_users", rows=batch)
                batch = []
        if batch:
            inserted += await self.db.execute("insert_users", rows=batch)
        return inserted

    # -- the ledger -----------------------------------------------------------------------

    async def claim(
        self,
        *,
        year: int,
        month: int,
        ids: Sequence[int],
        new_ids: Iterable[int],
        me: str,
        lease_ms: int,
    ) -> dict[int, Claim]:
        """Claim ``ids`` for ``me``; return every id's ledger row after the attempt.

        ``new_ids`` are those the page saw without a ledger row (inserted); the rest are
        taken over only if their lease expired or was released.
        """
        if not ids:
            return {}
        now = now_ms()
        until = now + lease_ms
        fresh = [
            (self.job, year, uid, month, int(State.PENDING), 0, me, until, 0, now)
            for uid in new_ids
        ]
        inserted = await self.db.execute("claim_new", rows=fresh) if fresh else 0
        if inserted == len(ids):
            # Every row is new and ours: nothing to read back (the common case).
            claims = {
                uid: Claim(uid, int(State.PENDING), me, until) for uid in (r[2] for r in fresh)
            }
            self._hold(me, year, claims)
            return claims
        if len(fresh) < len(ids):
            await self.db.execute(
                "claim_expired",
                job=self.job,
                year=year,
                ids=list(ids),
                me=me,
                until=until,
                now=now,
            )
        claims = await self.claims_of(year=year, ids=ids)
        self._hold(me, year, claims)
        return claims

    def _hold(self, me: str, year: int, claims: dict[int, Claim]) -> None:
        held = self._held.setdefault(me, (year, set()))[1]
        held.update(
            uid for uid, c in claims.items() if c.owner == me and c.state not in FINAL_STATES
        )

    def _let_go(self, me: str, ids: Sequence[int]) -> None:
        entry = self._held.get(me)
        if entry is not None:
            entry[1].difference_update(ids)

    async def claims_of(self, *, year: int, ids: Sequence[int]) -> dict[int, Claim]:
        """The ledger rows of ``ids`` (absent ids have none)."""
        if not ids:
            return {}
        rows = await self.db.fetchall("claims_of", job=self.job, year=year, ids=list(ids))
        return {int(r[0]): Claim(int(r[0]), int(r[1]), r[2], r[3]) for r in rows}

    async def finish(
        self,
        *,
        year: int,
        ids: Sequence[int],
        me: str,
        state: State,
        error: str | None = None,
        queued: bool = False,
    ) -> int:
        """Record the outcome of ``ids`` and let go of their claims."""
        if not ids:
            return 0
        self._let_go(me, ids)
        return await self.db.execute(
            "finish",
            job=self.job,
            year=year,
            ids=list(ids),
            me=me,
            state=int(state),
            error=error[:500] if error else None,
            queued=int(queued),
            now=now_ms(),
        )

    async def release(self, *, year: int, ids: Sequence[int], me: str) -> int:
        """Let go of unfinished claims so the next run takes them at once."""
        if not ids:
            return 0
        self._let_go(me, ids)
        return await self.db.execute(
            "release", job=self.job, year=year, ids=list(ids), me=me, now=now_ms()
        )

    async def heartbeat(self, *, me: str, lease_ms: int) -> int:
        """Extend every claim ``me`` holds."""
        entry = self._held.get(me)
        if entry is None or not entry[1]:
            return 0
        year, held = entry
        return await self.db.execute(
            "heartbeat",
            job=self.job,
            year=year,
            lo=min(held),
            hi=max(held),
            me=me,
            until=now_ms() + lease_ms,
        )

    async def unqueued_failures(self, limit: int) -> list[Row]:
        """Temporary failures whose retry message could not be queued."""
        return await self.db.fetchall("unqueued_failures", limit=limit)

    async def mark_queued(self, *, year: int, ids: Sequence[int]) -> None:
        """Note that ``ids`` now have a retry message on the queue."""
        if ids:
            await self.db.execute("mark_queued", job=self.job, year=year, ids=list(ids))

    # -- cards ----------------------------------------------------------------------------

    async def insert_cards(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """Multi-row INSERT IGNORE of (email, message, status, scheduled_at, code, key);
        returns how many rows were inserted (ignored ones already existed)."""
        if not rows:
            return 0
        return await self.db.execute("insert_cards", rows=list(rows))

    async def cards_by_key(self, keys: Sequence[str]) -> dict[str, str]:
        """idempotency key -> gift code of the cards that exist."""
        if not keys:
            return {}
        rows = await self.db.fetchall("cards_by_key", keys=list(keys))
        return {str(r[0]): str(r[1]) for r in rows}

    # -- status ---------------------------------------------------------------------------

    async def status(self, *, year: int, month: int, problems: int = 50) -> StatusCounts:
        """Counts for one month of this job."""
        params = {"job": self.job, "year": year, "month": month}
        counts = await self.db.fetchone("status_counts", **params) or (0, 0, 0, 0)
        cards = await self.db.fetchval("status_cards", **params) or 0
        pending = await self.db.fetchval("status_pending", **params) or 0
        rows = await self.db.fetchall("status_problems", **params, limit=problems)
        return StatusCounts(
            cards=int(cards),
            emails_sent=int(counts[0]),
            pending=int(pending),
            skipped=int(counts[1]),
            retrying=int(counts[2]),
            failed_permanent=int(counts[3]),
            problems=[(int(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows],
        )

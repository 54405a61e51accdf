"""The store: batchrun's ledger and suppression list (and, from ``schema.Schema``, its
schema), written once for every dialect; it knows no job.

A job's own tables are the job's: it reaches them through ``ctx.db`` (``JobDatabase``) and
brings their schema steps in ``Job.sql``; the store only applies those steps in order.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Literal, TypeVar

from batchrun.db.base import Database, JobDatabase
from batchrun.db.base import now_ms as now_ms  # re-exported: tests and scripts import it here
from batchrun.db.clock import server_clock
from batchrun.db.schema import Schema
from batchrun.db.suppression import (  # re-exported: the suppression list's names
    MAX_ADDRESS_CHARS as MAX_ADDRESS_CHARS,
)
from batchrun.db.suppression import MAX_SOURCE_CHARS as MAX_SOURCE_CHARS
from batchrun.db.suppression import REASONS as REASONS
from batchrun.db.suppression import Reason as Reason
from batchrun.db.suppression import Suppression as Suppression
from batchrun.db.suppression import SuppressionList
from batchrun.db.suppression import storable_key as storable_key
from batchrun.errors import LockTimeoutError
from batchrun.mail.address import address_key as address_key  # re-exported: the list's key

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class State(IntEnum):
    """An entity's state in the ledger for one (job, once_per period)."""

    PENDING = 0  # claimed or released, not finished
    SUCCEEDED = 1  # done (for an email job: the email was accepted)
    SENT = 1  # SUCCEEDED's name before jobs other than mail (the stored value is the same)
    SKIPPED = 2  # ended for good without failure (invalid address, not eligible any more)
    RETRYING = 3  # failed temporarily, waiting in the retry queue
    FAILED = 4  # failed for good (permanent error or out of attempts)


FINAL_STATES = frozenset({State.SUCCEEDED, State.SKIPPED, State.FAILED})
MAX_ID = 2**63 - 1  # the largest id a BIGINT column (and SQLite's INTEGER) can hold

# How long an outcome write or a release keeps going again while another session's lock
# holds its rows (each try waits the adapter's lock timeout, then backs off): a long
# transaction delays the run's bookkeeping, it does not end the run.
LOCK_PATIENCE_S = 600.0


@dataclass(frozen=True, slots=True)
class Scope:
    """Where ledger rows live: a job, its once_per period (the key) and the run's period."""

    job: str
    once: str
    period: str


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds an entity's ledger row now, and how it stands."""

    entity_id: int
    state: int
    owner: str | None
    lease_until: int | None
    attempts: int = 0
    queued: bool = False


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """What the ledger says of one (job, period)."""

    succeeded: int
    skipped: int
    retrying: int
    failed_permanent: int
    claimed: int
    problems: list[tuple[int, int, int, str | None]]
    bounces: int = 0  # permanent bounces SES reported for the period's emails
    complaints: int = 0


class Store(Schema, SuppressionList):
    """Schema (``Schema``: migrate, plan, what jobs need), ledger and suppression-list
    operations over a Database."""

    python_steps: ClassVar[Mapping[str, tuple[str, str]]] = {
        "migrate_0040_suppression_keys": ("rekey_suppressions", "batchrun_suppression")
    }

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.jobdb = JobDatabase(db)
        # The batchrun_run row this process's claims belong to (control/runrecord.py sets
        # it); None: claims are recorded without one.
        self.run_id: int | None = None

    # -- the ledger -----------------------------------------------------------------------

    async def period_started(self, *, job: str, period: str) -> bool:
        """Whether any ledger row exists for the job's period (a run has been at it)."""
        row = await self.db.fetchone("period_started", job=job, period=period)
        return row is not None

    async def claim(
        self,
        scope: Scope,
        *,
        ids: Sequence[int],
        new_ids: Iterable[int],
        me: str,
        lease_ms: int,
    ) -> dict[int, Claim]:
        """Claim ``ids`` for ``me``; return every id's ledger row after the attempt.

        ``new_ids`` are those seen without a ledger row (inserted); the rest are taken
        over only if their lease expired or was released.
        """
        if not ids:
            return {}
        now = await self.db.clock_ms()  # the server's clock: one for every host
        until = now + lease_ms
        # The run's id goes with the claim (``batchrun why`` names it): a second statement
        # for it cost the database a quarter of its CPU a page, measured.
        run = self.run_id
        fresh = [
            (
                scope.job,
                scope.once,
                uid,
                scope.period,
                int(State.PENDING),
                0,
                me,
                until,
                0,
                now,
                run,
            )
            for uid in new_ids
        ]
        inserted = await self.db.execute("claim_new", rows=fresh) if fresh else 0
        if inserted == len(ids):
            # Every row is new and ours: nothing to read back (the common case).
            return {r[2]: Claim(r[2], int(State.PENDING), me, until) for r in fresh}
        if len(fresh) < len(ids):
            await self.db.execute(
                "claim_expired",
                job=scope.job,
                once=scope.once,
                ids=list(ids),
                me=me,
                until=until,
                now=now,
                run=run,
            )
        return await self.claims_of(scope, ids)

    async def claims_of(self, scope: Scope, ids: Sequence[int]) -> dict[int, Claim]:
        """The ledger rows of ``ids`` (absent ids have none)."""
        if not ids:
            return {}
        rows = await self.db.fetchall("claims_of", job=scope.job, once=scope.once, ids=list(ids))
        return {
            int(r[0]): Claim(int(r[0]), int(r[1]), r[2], r[3], int(r[4]), bool(r[5])) for r in rows
        }

    async def ledger_entry(
        self, scope: Scope, entity_id: int
    ) -> tuple[State, int, str | None] | None:
        """The entity's (state, attempts, last error) in the ledger, None without a row."""
        row = await self.db.fetchone("ledger_entry", job=scope.job, once=scope.once, id=entity_id)
        return None if row is None else (State(int(row[0])), int(row[1]), row[2])

    async def finish(
        self,
        scope: Scope,
        *,
        ids: Sequence[int],
        me: str,
        state: State,
        error: str | None = None,
        queued: bool = False,
    ) -> int:
        """Record the outcome of ``ids`` held by ``me``; return how many rows it changed
        (fewer than ``ids``: some claims were lost to another run)."""
        if not ids:
            return 0
        params = {
            "job": scope.job,
            "once": scope.once,
            "ids": list(ids),
            "me": me,
            "state": int(state),
            "error": error[:500] if error else None,
            "queued": int(queued),
            # updated_at only (no lease is compared with it), on the claims' clock
            "now": await server_clock(self.db).now_ms(),
        }
        changed, reran = await patiently(
            "ledger finish", lambda: self.db.execute_reran("finish", **params)
        )
        if reran and changed < len(ids):
            # The first try's reply was lost: it may have finished some rows itself, and
            # the second then found them no longer ours. Rows in the very state written,
            # and held by no one, are those (another run's takeover would have to expire
            # this run's lease and finish them alike within the same moment).
            rows = await self.claims_of(scope, ids)
            finished = sum(
                1
                for c in rows.values()
                if c.owner is None and c.state == int(state) and c.lease_until is None
            )
            changed = max(changed, min(finished, len(ids)))
        return changed

    async def release(self, scope: Scope, *, ids: Sequence[int], me: str) -> int:
        """Let go of unfinished claims so the next run takes them at once."""
        if not ids:
            return 0
        now = await server_clock(self.db).now_ms()
        return await patiently(
            "ledger release",
            lambda: self.db.execute(
                "release", job=scope.job, once=scope.once, ids=list(ids), me=me, now=now
            ),
        )

    async def clock_ms(self) -> int:
        """The database server's clock (epoch ms), which every lease is compared with."""
        return await self.db.clock_ms()

    async def heartbeat(self, scope: Scope, *, lo: int, hi: int, me: str, lease_ms: int) -> int:
        """Extend the claims ``me`` holds with ids in [lo, hi]; return how many."""
        return await self.db.execute(
            "heartbeat",
            job=scope.job,
            once=scope.once,
            lo=lo,
            hi=hi,
            me=me,
            until=await self.db.clock_ms() + lease_ms,
        )

    async def unqueued_failures(self, limit: int) -> list[tuple[Scope, int, int, str | None]]:
        """Temporary failures whose retry message could not be queued:
        (scope, entity id, attempts, last error)."""
        rows = await self.db.fetchall("unqueued_failures", limit=limit)
        return [(Scope(str(r[0]), str(r[1]), str(r[2])), int(r[3]), int(r[4]), r[5]) for r in rows]

    async def mark_queued(self, scope: Scope, ids: Sequence[int]) -> None:
        """Note that ``ids`` now have a retry message on the queue."""
        if ids:
            await patiently(
                "ledger mark_queued",
                lambda: self.db.execute(
                    "mark_queued", job=scope.job, once=scope.once, ids=list(ids)
                ),
            )

    async def record_mail_event(
        self, *, job: str, once: str, entity_id: int, event: Literal["bounce", "complaint"]
    ) -> bool:
        """Note a bounce or complaint on an entity's ledger row (its state stays); whether
        the row exists (a complaint is never overwritten by a bounce)."""
        changed = await self.db.execute(
            "ledger_mail_event", job=job, once=once, id=entity_id, event=event
        )
        return changed > 0

    # -- status ---------------------------------------------------------------------------

    async def status(self, *, job: str, period: str, problems: int = 50) -> StatusCounts:
        """The ledger's counts for one job and period, and the first ``problems`` rows."""
        counts = await self.db.fetchone("status_counts", job=job, period=period) or (0,) * 5
        rows = (
            await self.db.fetchall("status_problems", job=job, period=period, limit=problems)
            if problems
            else []
        )
        events = await self.db.fetchone("status_mail_events", job=job, period=period) or (0, 0)
        return StatusCounts(
            bounces=int(events[0]),
            complaints=int(events[1]),
            succeeded=int(counts[0]),
            skipped=int(counts[1]),
            retrying=int(counts[2]),
            failed_permanent=int(counts[3]),
            claimed=int(counts[4]),
            problems=[(int(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows],
        )


async def patiently(
    what: str,
    write: Callable[[], Awaitable[_T]],
    *,
    patience_s: float = LOCK_PATIENCE_S,
    stopping: Callable[[], bool] | None = None,
) -> _T:
    """``write()``, again with backoff while it fails on a lock another session holds (a
    lock wait, deadlock or serialization failure: the statement was undone), for up to
    ``patience_s``, or until ``stopping()`` says the process is stopping. ``what`` names
    it in the one warning ("ledger finish")."""
    started = time.monotonic()
    tries = 0
    while True:
        try:
            return await write()
        except LockTimeoutError as exc:
            tries += 1
            if time.monotonic() - started >= patience_s or (stopping is not None and stopping()):
                raise
            if tries == 1:
                log.warning("%s waits for a lock another session holds: %s", what, exc)
            await asyncio.sleep(min(5.0, 0.1 * 2**tries) * random.uniform(0.5, 1.0))

"""The entity source of a run: the job's keyset pages, claimed; then what other runs held.

batchrun pages on the last id, leaves out entities the ledger says are finished for the
once_per period, claims the rest and hands the page to ``prepare``. Before the run ends it
waits for entities other runs hold to finish, or for their claims to expire, and then does
them itself: so a rerun right after ``kill -9`` completes the period in one invocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from batchrun.db.base import Database
from batchrun.db.store import (
    FINAL_STATES,
    LOCK_PATIENCE_S,
    MAX_ID,
    Claim,
    Scope,
    Store,
    patiently,
)
from batchrun.errors import (
    BatchrunError,
    JobError,
    LockTimeoutError,
    OutcomeUnknownError,
    StatementError,
)
from batchrun.job import Context, Job
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.item import Item
from batchrun.pipeline.lease import Lease

log = logging.getLogger(__name__)
_R = TypeVar("_R")


ASK_AGAIN = 5  # times a page or a prepare goes again after its connection was lost


async def again_after_lost(
    what: str, call: Callable[[], Awaitable[_R]], stopping: Callable[[], bool] | None = None
) -> _R:
    """``call()``, again when one of the job's statements in it lost its connection (up
    to ``ASK_AGAIN`` times, with backoff) or waited out a lock another session holds (the
    statement undone; for up to ``LOCK_PATIENCE_S``, as batchrun's own writes wait): for
    ``page`` (a query, by the contract) and ``prepare`` (batched effects keyed like
    ``process``'s), going again as a whole is safe, as retrying an entity is; the
    statement itself is never re-run alone. A lock on the application's own tables (its
    migration, a long transaction) delays the run; it ended it after some 8 s. The wait
    ends early when ``stopping()`` says so (a signal, the Lambda's deadline)."""
    tries = 0
    while True:
        try:
            # A lock wait, as batchrun's own writes wait one out (``patiently``).
            return await patiently(what, call, patience_s=LOCK_PATIENCE_S, stopping=stopping)
        except OutcomeUnknownError as exc:
            tries += 1
            if tries > ASK_AGAIN:
                raise
            log.warning("%s lost its database connection; asking again: %s", what, exc)
            await asyncio.sleep(0.1 * 2**tries)


def _stopping(ctx: Context) -> Callable[[], bool] | None:
    """Whether the work ``ctx`` serves is stopping: its effects' stop token (None for a
    context a test made without one)."""
    stop = getattr(getattr(ctx, "_effects", None), "stop", None)
    return None if stop is None else (lambda: bool(stop.stopping))


async def page(job: Job, ctx: Context, after: int, limit: int) -> list[dict[str, Any]]:
    """``job.page``, checked: rows with an integer ``id`` above ``after``, ascending.

    Raises:
        JobError: the page failed in the job's own code or SQL (a table of its own that
            does not exist, a parameter not given), or returned something else: one line
            naming the job. The database's own failures (an outage, a lock wait, a lost
            reply) and batchrun's errors as they are.
    """
    try:
        rows = await again_after_lost(
            f"{job.name} page", lambda: job.page(ctx, after, limit), _stopping(ctx)
        )
    except StatementError as exc:
        raise JobError(f"job {job.name!r}: page(): {exc}") from exc
    except BatchrunError:
        raise
    except Exception as exc:
        raise JobError(f"job {job.name!r}: page() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(rows, list):
        if inspect.iscoroutine(rows):
            rows.close()  # no "never awaited" warning besides the error
            raise JobError(f"job {job.name!r}: page() returned a coroutine: an await is missing")
        raise JobError(
            f"job {job.name!r}: page() returned {type(rows).__name__}, not a list of dicts"
        )
    last = after
    for row in rows:
        entity_id = row.get("id") if isinstance(row, dict) else None
        if not isinstance(entity_id, int) or isinstance(entity_id, bool):
            raise JobError(f"job {job.name!r}: page() returned a row without an integer 'id'")
        if entity_id <= last:
            raise JobError(
                f"job {job.name!r}: page(after={after}) returned id {entity_id} after {last}: "
                "ids must be ascending and above `after`"
            )
        last = entity_id
    if len(rows) > limit:
        raise JobError(f"job {job.name!r}: page() returned {len(rows)} rows for limit {limit}")
    return rows


async def recheck(job: Job, ctx: Context, entity_id: int) -> dict[str, Any] | None:
    """The entity's row if the job's page still returns it (still eligible), else None."""
    rows = await page(job, ctx, entity_id - 1, 1)
    return rows[0] if rows and rows[0]["id"] == entity_id else None


async def prepare(job: Job, ctx: Context, rows: list[dict[str, Any]]) -> None:
    """``job.prepare``, once the page's addresses (its ``Job.address`` column, when it has
    one) are looked up on the suppression list: one query a page, whose answers
    ``prepare``'s own ``ctx.suppressed`` and every ``send_email`` of the page reuse."""
    column = job.address  # None: the job sends no email
    addresses = [a for r in rows if isinstance(a := r.get(column), str)] if column else []
    if addresses:
        await ctx.suppressed(addresses)
    await again_after_lost(f"{job.name} prepare", lambda: job.prepare(ctx, rows), _stopping(ctx))


def unfinished(rows: Sequence[dict[str, Any]], ledger: dict[int, Claim]) -> list[dict[str, Any]]:
    """The rows whose ledger entry (if any) is not final."""
    return [r for r in rows if (c := ledger.get(r["id"])) is None or c.state not in FINAL_STATES]


class LoadGate:
    """``--max-db-load``: before a page, wait while the server runs more than ``limit``
    statements at once (its Threads_running, batchrun's own and this check included).

    It re-checks every ``poll_s``; the first pause of a run is logged, and every pause
    adds to ``paused_s`` (the summary's ``db_paused_s``). A database without such a
    figure (SQLite) never pauses. A stop ends the wait.
    """

    def __init__(
        self, db: Database, limit: int | None, stop: StopToken, *, poll_s: float = 0.5
    ) -> None:
        self.db = db
        self.limit = limit
        self.stop = stop
        self.poll_s = poll_s
        self.paused_s = 0.0
        self.pauses = 0

    async def wait(self) -> None:
        if self.limit is None:
            return
        running = await self.db.threads_running()
        if running is None or running <= self.limit:
            return
        if self.pauses == 0:
            log.warning(
                "database busy (Threads_running %d, above --max-db-load %d): pausing new "
                "pages until it falls back",
                running,
                self.limit,
            )
        self.pauses += 1
        started = time.monotonic()
        try:
            while not self.stop.stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait_stopping(), timeout=self.poll_s)
                running = await self.db.threads_running()
                if running is None or running <= self.limit:
                    break
        finally:
            paused = time.monotonic() - started
            self.paused_s += paused
            log.info("database load fell back: pages resume after %.1f s", paused)


class Pager:
    """Yields claimed, prepared entities of (after, until]; remembers where it stopped."""

    def __init__(
        self,
        job: Job,
        ctx: Context,
        scope: Scope,
        *,
        store: Store,
        lease: Lease,
        stop: StopToken,
        page_limit: Callable[[], int],
        on_claimed: Callable[[int], None],
        start_after: int = 0,
        until: int = MAX_ID,
        poll_s: float = 1.0,
        gate: LoadGate | None = None,
    ) -> None:
        self.job = job
        self.ctx = ctx
        self.scope = scope
        self.store = store
        self.lease = lease
        self.stop = stop
        self.page_limit = page_limit
        self.on_claimed = on_claimed
        self.cursor = start_after
        self.until = until
        self.poll_s = poll_s
        self.gate = gate
        self.done = False  # every page was read and every foreign claim settled
        self.foreign: set[int] = set()  # entities other runs hold
        self.unyielded: deque[Item] = deque()

    async def items(self) -> AsyncIterator[Item]:
        # A period nobody has started needs no ledger look-up per page (one row read per
        # entity instead of two); whatever another run does meanwhile, claiming sorts out.
        fresh = not await self.store.period_started(job=self.scope.job, period=self.scope.period)
        while not self.stop.stopping:
            limit = self.page_limit()
            if limit <= 0:
                self.done = True
                return
            if not await self.lease.fence():
                return  # stopped while the claims already held could not be renewed
            if self.gate is not None:
                await self.gate.wait()
                if self.stop.stopping:
                    continue  # the loop ends: stopped while paused
            rows = await page(self.job, self.ctx, self.cursor, limit)
            if not rows:
                break
            after, self.cursor = self.cursor, rows[-1]["id"]
            in_range = [r for r in rows if r["id"] <= self.until]
            await self._claim_and_prepare(in_range, fresh=fresh)
            log.info(
                "%s %s: page after id %d: %d rows, %d claimed",
                self.scope.job,
                self.scope.period,
                after,
                len(rows),
                len(self.unyielded),
            )
            while self.unyielded and not self.stop.stopping:
                yield self.unyielded.popleft()
            if len(in_range) < len(rows):
                break  # past the end of this range
        else:
            return
        async for item in self._foreign():
            yield item
        self.done = not self.stop.stopping

    async def _foreign(self) -> AsyncIterator[Item]:
        """Entities other runs hold: wait until they finish them or their claims expire."""
        if self.foreign:
            log.info(
                "%s %s: waiting for %d entities other runs hold",
                self.scope.job,
                self.scope.period,
                len(self.foreign),
            )
        while self.foreign and not self.stop.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait_stopping(), timeout=self.poll_s)
            ids = sorted(self.foreign)
            claims = await self.store.claims_of(self.scope, ids)
            now = await self.store.clock_ms()  # leases are on the server's clock
            takeable = []
            for uid in ids:
                claim = claims.get(uid)
                if claim is not None and claim.state in FINAL_STATES:
                    self.foreign.discard(uid)  # finished (or failed for good) by its owner
                elif claim is None or claim.owner is None or (claim.lease_until or 0) < now:
                    takeable.append(uid)  # no row: a claim that could not insert it
            if not takeable:
                continue
            self.foreign.difference_update(takeable)
            rows = [row for uid in takeable if (row := await recheck(self.job, self.ctx, uid))]
            await self._claim_and_prepare(rows, fresh=False)
            while self.unyielded and not self.stop.stopping:
                yield self.unyielded.popleft()

    async def claim_rest(self) -> None:
        """Claim what is left of the run's share (``page_limit``) into ``unyielded``, not
        prepared: a run with ``--limit`` whose breaker opened queues its whole share for
        retry, rather than hand a continuation on that a rerun's would double."""
        while (limit := self.page_limit()) > 0:
            rows = await page(self.job, self.ctx, self.cursor, limit)
            if not rows:
                self.done = not self.foreign
                return
            self.cursor = rows[-1]["id"]
            in_range = [r for r in rows if r["id"] <= self.until]
            await self._claim_and_prepare(in_range, fresh=False, with_prepare=False)
            if len(in_range) < len(rows):
                self.done = not self.foreign
                return

    async def _claim_and_prepare(
        self, rows: list[dict[str, Any]], *, fresh: bool, with_prepare: bool = True
    ) -> None:
        """Claim the unfinished ``rows``, ``prepare`` them; queue them in ``unyielded``.

        Claimed entities wait in ``unyielded`` until the runner takes them: if the run
        stops first, it still names them, so they are released or queued, never forgotten.
        """
        if not rows:
            return
        ledger: dict[int, Claim] = {}
        if not fresh:
            ledger = await self.store.claims_of(self.scope, [r["id"] for r in rows])
            rows = unfinished(rows, ledger)
            if not rows:
                return
        ids = [r["id"] for r in rows]
        try:
            claims = await self.lease.claim(self.scope, ids, [i for i in ids if i not in ledger])
        except LockTimeoutError as exc:
            # Another session holds a lock on some of these ledger rows (a long transaction)
            # and the statement gave up on it: treat them as held by another run and claim
            # them again in the wait for foreign claims, rather than fail the whole run.
            log.warning(
                "could not claim %d entities of %s %s yet, a row is locked (%s); "
                "trying again later",
                len(ids),
                self.scope.job,
                self.scope.period,
                exc,
            )
            self.foreign.update(ids)
            return
        me = self.lease.me
        items = []
        for row in rows:
            claim = claims.get(row["id"])
            if claim is None or claim.state in FINAL_STATES:
                continue
            if claim.owner == me:
                items.append(Item(self.scope, row["id"], row, claim.attempts, claim.queued))
            else:
                # Held by another owner, live or not: a lease that expired after this claim
                # was tried is taken over by the wait in _foreign, never dropped.
                self.foreign.add(row["id"])
        self.on_claimed(len(items))
        if items and with_prepare:
            try:
                await prepare(self.job, self.ctx, [i.row for i in items])
            except BaseException:
                self.unyielded.extend(items)  # claimed, never worked: the run lets them go
                raise
        self.unyielded.extend(items)
        return

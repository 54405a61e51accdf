"""One run of a job over a period: its pages on the road, then the hand-off.

Each entity ends succeeded, skipped, failed for good, queued for retry, or released for
the next run (a stop); on a stop with ``handoff`` (the Lambda, a worker) the rest of the
period goes on through the queue as a continuation carrying what is left of ``--limit``.
When the circuit breaker opens in a run with ``--limit``, the run claims the rest of its
share and queues it for retry instead: its share is then fixed, so a rerun's hand-off
cannot add a second one. A mail backend that does not answer before the run begins
(``hand_on``) sends the whole range on the same way, nothing claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from batchrun.control.history import CANCELLED
from batchrun.db.store import MAX_ID, Scope, State
from batchrun.errors import NotMigratedError, QueueError
from batchrun.job import Context, Job
from batchrun.period import Period
from batchrun.pipeline.apply import Applier, LedgerWrites
from batchrun.pipeline.engine import Progress, StopToken
from batchrun.pipeline.item import Item
from batchrun.pipeline.lease import Lease
from batchrun.pipeline.outcomes import Outcome
from batchrun.pipeline.pager import LoadGate, Pager
from batchrun.pipeline.reports import Summary, counter_key, counter_names
from batchrun.pipeline.road import travel
from batchrun.pipeline.wiring import Wiring
from batchrun.pipeline.work import EntityWorker
from batchrun.policy.bugs import BugStreak
from batchrun.policy.pacing import BREAKER_REASON, CircuitBreaker
from batchrun.queue.base import QueueMessage

log = logging.getLogger(__name__)
# How long a run that ends on an error tries to let go of what it never started.
RELEASE_ON_ERROR_S = 10.0


@dataclass
class Options:
    """Run options from the CLI or the Lambda event."""

    concurrency: int = 20
    rate: float | Literal["auto"] | None = None  # "auto": up to the provider's own limit
    page_size: int = 500
    limit: int | None = None
    handoff: bool = False  # on a stop, hand the rest of the period on through the queue
    # When the breaker opens, hand the rest on too (a consumer instead keeps the message it
    # works, for a later delivery: a new continuation each outage would go round forever).
    breaker_handoff: bool = True
    grace_s: float = 30.0  # after a stop, how long in-flight work may take to finish
    # Pause taking pages while the server's Threads_running is above this (None: the
    # settings' BATCHRUN_MAX_DB_LOAD, else never). MySQL/MariaDB only.
    max_db_load: int | None = None
    on_progress: Callable[[Progress], None] | None = None
    # Given the run's summary as the run starts: what it reached is known if it fails.
    on_start: Callable[[Summary], None] | None = None

    def progress(self, kind: Literal["done", "failed", "skipped"], count: int = 1) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(kind, count))


def new_summary(job: Job, period: Period, dry_run: bool) -> Summary:
    """The summary of a run of ``job`` over ``period`` that has done nothing yet: every count
    and the job's counters at 0, ``month`` for a month job."""
    return Summary(
        job.name,
        str(period),
        dry_run,
        counters=dict.fromkeys(map(counter_key, counter_names(job.counters)), 0),
        month=str(period) if period.unit == "month" else None,
    )


def scope_of(ctx: Context) -> Scope:
    return Scope(ctx.job.name, str(ctx.once), str(ctx.period))


async def run_period(
    w: Wiring,
    stop: StopToken,
    job: Job,
    period: Period,
    options: Options,
    *,
    dry_run: bool = False,
    after: int = 0,
    until: int = MAX_ID,
) -> Summary:
    """Run ``job`` over ``period`` (entities with ids in (after, until])."""
    summary = new_summary(job, period, dry_run)
    if options.on_start is not None:
        options.on_start(summary)
    started = time.monotonic()
    missing = await w.store.missing_requirements(job)
    if missing is not None:
        raise NotMigratedError(missing)  # before anything is claimed
    if dry_run:
        from batchrun.pipeline.dryrun import dry_run as count

        await count(w, stop, job, period, options, summary, after, until)
        if stop.stopping:  # a signal, the Lambda's deadline: its counts are partial
            summary.stopped = stop.reason or "stopped"
        summary.duration_s = time.monotonic() - started
        return summary
    stop = stop.child()  # a breaker stops this run, not a worker serving many
    log.info(
        "%s %s: started (concurrency %d, pages of %d)",
        job.name,
        period,
        options.concurrency,
        options.page_size,
    )
    pool = w.effects.backends
    before = pool.snapshot()
    try:
        async with (
            pool.session(options.rate),
            Lease(w.store, lease_s=w.settings.lease_s, stop=stop, steering=w.steering) as lease,
        ):
            try:
                await _run(w, job, period, options, summary, lease, after, until)
            finally:
                summary.lost_claims = lease.lost_claims
                if job.backends:
                    summary.backends = pool.figures(job.backends, since=before)
    finally:
        stop.detach()
        summary.duration_s = time.monotonic() - started
    log.info(
        "%s %s: %s: %d succeeded, %d skipped, %d failed in %.1f s",
        job.name,
        period,
        f"stopped ({summary.stopped})" if summary.stopped else "finished",
        summary.succeeded,
        summary.skipped,
        summary.failed,
        summary.duration_s,
    )
    return summary


async def _run(
    w: Wiring,
    job: Job,
    period: Period,
    options: Options,
    summary: Summary,
    lease: Lease,
    after: int,
    until: int,
) -> None:
    stop = lease.stop
    limiter = await w.effects.limiter(options.rate)
    breaker = CircuitBreaker(w.settings.breaker_threshold)
    ctx, sender = w.effects.context(
        job, period, summary=summary, lease=lease, stop=stop, limiter=limiter, breaker=breaker
    )
    scope = scope_of(ctx)
    gate = load_gate(w, options, stop)
    writes = LedgerWrites(w.store, w.queue, lease, summary=summary, enqueue=True)
    applier = Applier(writes.write)
    bugs = BugStreak(w.settings.bug_threshold)

    busy: list[Item] = []  # released on a stop while their backend was busy

    def counted(item: Item, outcome: Outcome, recorded: bool) -> None:
        if outcome.busy:
            summary.left_pending += 1
            busy.append(item)
        elif not recorded:
            summary.unrecorded += 1  # the run ends on the error that kept it from the ledger
        elif outcome.state is State.SUCCEEDED:
            summary.succeeded += 1
            options.progress("done")
        elif outcome.state is State.SKIPPED:
            summary.skipped += 1
            options.progress("skipped")
        else:
            summary.failed_for(outcome.reason or "failed")
            summary.unknown_outcome += outcome.unknown
            options.progress("failed")

    def claimed(count: int) -> None:
        summary.eligible += count

    worker = EntityWorker(
        job,
        ctx,
        lease=lease,
        applier=applier,
        breaker=breaker,
        stop=stop,
        limiter=limiter,
        policy=w.policy(job, run=True),
        at_once=True,  # a run's failures: available to `batchrun retry` at once
        on_outcome=counted,
        bugs=bugs,
    )
    pager = Pager(
        job,
        ctx,
        scope,
        store=w.store,
        lease=lease,
        stop=stop,
        page_limit=lambda: page_limit(options, summary.eligible),
        on_claimed=claimed,
        start_after=after,
        until=until,
        poll_s=min(1.0, w.settings.lease_s / 5),
        gate=gate,
    )
    never_started: list[Item] = []
    try:
        try:
            leftover = await travel(
                pager.items(),
                worker,
                concurrency=options.concurrency,
                stop=stop,
                grace_s=options.grace_s,
                unyielded=pager.unyielded,
                left_on_error=never_started,
            )
        except Exception:
            # The run ends on this error: what it claimed and never started is let go of
            # now, not held until its lease ran out (a rerun waited), and left_pending.
            if never_started:
                # One short try: the error that ended the run is the one told, and soon.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(RELEASE_ON_ERROR_S):
                        await lease.release(scope, [i.id for i in never_started])
                    summary.left_pending += len(never_started)
            raise
        await applier.close()
        if breaker.open and options.limit is not None:
            known = len(pager.unyielded)  # already among the leftovers
            await pager.claim_rest()
            rest = list(pager.unyielded)[known:]
            leftover += [i for i in rest if not lease.lost(i)]
        released: list[Item] = list(busy)
        if breaker.open:
            summary.stopped = breaker.reason or BREAKER_REASON
            await writes.write([(i, Outcome(State.RETRYING, summary.stopped)) for i in leftover])
            summary.failed_for(summary.stopped, len(leftover))
        elif leftover:
            await lease.release(scope, [i.id for i in leftover])
            summary.left_pending += len(leftover)
            released += leftover
        if bugs.tripped is not None:
            # Like the breaker, but the rest waits for a fixed job: released, not queued,
            # and no hand-off (a continuation would only meet the bug again).
            summary.error = bugs.tripped
        if stop.stopping and summary.stopped is None:
            summary.stopped = stop.reason or "stopped"
        if bugs.tripped is None and (
            (breaker.open and options.breaker_handoff)
            or (stop.stopping and not breaker.open and options.handoff and stop.reason != CANCELLED)
        ):
            await _hand_off(w, job, period, options, summary, pager, released, until)
    finally:
        await applier.close()
        summary.db_paused_s = round(gate.paused_s, 3)
        summary.throttles = sender.throttles + sender.pacer.throttles
        if limiter is not None:
            summary.send_rate = round(limiter.settled, 2)
            summary.send_rate_peak = round(limiter.peak, 2)


async def _hand_off(
    w: Wiring,
    job: Job,
    period: Period,
    options: Options,
    summary: Summary,
    pager: Pager,
    released: list[Item],
    until: int,
) -> None:
    """Queue the rest of the range as a continuation: below every entity this run released
    or saw held by another run (finished ones in between are left out by the ledger), with
    what is left of ``--limit`` (entities queued for retry count as done)."""
    remaining = None
    if options.limit is not None:
        remaining = options.limit - summary.eligible + len(released)
        if remaining <= 0:
            return
    if pager.done and not released:
        return
    if w.queue is None:
        return
    resume = min([pager.cursor, *(i.id - 1 for i in released), *(u - 1 for u in pager.foreign)])
    summary.continuation = await _send_continuation(w, job, period, resume, until, remaining)


async def hand_on(
    w: Wiring,
    job: Job,
    period: Period,
    options: Options,
    reason: str,
    *,
    after: int = 0,
    until: int = MAX_ID,
) -> Summary | None:
    """The mail backend did not answer before the run began: claim nothing, and hand the
    whole range (after, until] on as a continuation with all of ``--limit``, for `batchrun
    retry` (or a consumer) once it answers again. The summary says why (``stopped``); None
    when there is no queue or it did not take the message (the run then fails)."""
    if not await _send_continuation(w, job, period, after, until, options.limit):
        return None
    summary = new_summary(job, period, False)
    if options.on_start is not None:
        options.on_start(summary)
    summary.stopped = reason
    summary.continuation = True
    # The cause is in ``stopped``, which the CLI prints once (and the Lambda returns).
    log.info("%s %s: not started, the mail backend does not answer: handed on", job.name, period)
    return summary


async def _send_continuation(
    w: Wiring, job: Job, period: Period, after: int, until: int, limit: int | None
) -> bool:
    """Queue the range (after, until] of ``period``; whether the queue took it."""
    if w.queue is None:
        return False
    body = QueueMessage(
        "continuation", job.name, str(period), after_id=after, until_id=until, limit=limit
    ).to_json()
    try:
        await w.queue.send([body])
    except QueueError as exc:
        log.error("could not hand the rest of %s %s on (%s); run it again", job.name, period, exc)
        return False
    return True


def load_gate(w: Wiring, options: Options, stop: StopToken) -> LoadGate:
    limit = options.max_db_load if options.max_db_load is not None else w.settings.max_db_load
    return LoadGate(w.store.db, limit, stop)


def page_limit(options: Options, seen: int) -> int:
    if options.limit is None:
        return options.page_size
    return min(options.page_size, options.limit - seen)

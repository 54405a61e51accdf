"""One run of a job over a period: pages -> claims -> prepare -> process, then the hand-off.

Each entity ends succeeded, skipped, failed for good, queued for retry, or released for
the next run (a stop); on a stop with ``handoff`` (the Lambda, a worker) the rest of the
period goes on through the queue as a continuation carrying what is left of ``--limit``.
When the circuit breaker opens in a run with ``--limit``, the run claims the rest of its
share and queues it for retry instead: its share is then fixed, so a rerun's hand-off
cannot add a second one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from batchrun.control.history import CANCELLED
from batchrun.db.store import MAX_ID, Scope, State
from batchrun.effects.sending import make_limiter
from batchrun.errors import NotMigratedError, QueueError
from batchrun.job import Context, Job
from batchrun.mail.base import valid_address
from batchrun.period import Period
from batchrun.pipeline.engine import Progress, Runner, StopToken
from batchrun.pipeline.lease import Lease
from batchrun.pipeline.outcomes import Outcome
from batchrun.pipeline.pager import LoadGate, Pager, page, unfinished
from batchrun.pipeline.recorder import Item, Recorder
from batchrun.pipeline.reports import Summary
from batchrun.pipeline.work import Worker
from batchrun.policy.bugs import BugStreak
from batchrun.policy.pacing import BREAKER_REASON, CircuitBreaker
from batchrun.queue.base import QueueMessage

if TYPE_CHECKING:
    from batchrun.runtime.runtime import Runtime

log = logging.getLogger(__name__)


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


def new_summary(job: Job, period: Period, dry_run: bool) -> Summary:
    return Summary(
        job.name,
        str(period),
        dry_run,
        counters=dict.fromkeys(job.counters, 0),
        month=str(period) if period.unit == "month" else None,
    )


def scope_of(ctx: Context) -> Scope:
    return Scope(ctx.job.name, str(ctx.once), str(ctx.period))


async def run_period(
    rt: Runtime,
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
    missing = await rt.store.missing_requirements(job)
    if missing is not None:
        raise NotMigratedError(missing)  # before anything is claimed
    if dry_run:
        await _dry_run(rt, job, period, options, summary, after, until)
        summary.duration_s = time.monotonic() - started
        return summary
    stop = rt.stop.child()  # a breaker stops this run, not a worker serving many
    log.info(
        "%s %s: started (concurrency %d, pages of %d)",
        job.name,
        period,
        options.concurrency,
        options.page_size,
    )
    try:
        async with Lease(
            rt.store, lease_s=rt.settings.lease_s, stop=stop, steering=rt.steering
        ) as lease:
            try:
                await _run(rt, job, period, options, summary, lease, after, until)
            finally:
                summary.lost_claims = lease.lost_claims
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
    rt: Runtime,
    job: Job,
    period: Period,
    options: Options,
    summary: Summary,
    lease: Lease,
    after: int,
    until: int,
) -> None:
    stop = lease.stop
    limiter = await make_limiter(rt.mailer, options.rate)
    breaker = CircuitBreaker(rt.settings.breaker_threshold)
    ctx, sender = rt.context(
        job, period, summary=summary, lease=lease, stop=stop, limiter=limiter, breaker=breaker
    )
    scope = scope_of(ctx)
    gate = _load_gate(rt, options, stop)
    recorder = Recorder(rt.store, rt.queue, lease, summary=summary, enqueue=True)
    bugs = BugStreak(rt.settings.bug_threshold)
    runner: Runner[Item] = Runner(
        concurrency=options.concurrency,
        stop=stop,
        grace_s=options.grace_s,
        on_progress=options.on_progress,
    )

    def counted(item: Item, outcome: Outcome) -> None:
        if outcome.state is State.SENT:
            summary.succeeded += 1
            runner.progress("done")
        elif outcome.state is State.SKIPPED:
            summary.skipped += 1
            runner.progress("skipped")
        else:
            summary.failed += 1
            summary.unknown_outcome += outcome.unknown
            runner.progress("failed")

    def claimed(count: int) -> None:
        summary.eligible += count

    worker = Worker(
        job,
        ctx,
        lease=lease,
        recorder=recorder,
        breaker=breaker,
        stop=stop,
        limiter=limiter,
        policy=rt.policy(job, run=True),
        at_once=True,  # a run's failures: available to `batchrun retry` at once
        on_outcome=counted,
        bugs=bugs,
    )
    pager = Pager(
        job,
        ctx,
        scope,
        store=rt.store,
        lease=lease,
        stop=stop,
        page_limit=lambda: _page_limit(options, summary.eligible),
        on_claimed=claimed,
        start_after=after,
        until=until,
        poll_s=min(1.0, rt.settings.lease_s / 5),
        gate=gate,
    )
    try:
        result = await runner.run(pager.items(), worker.work)
        await recorder.close()
        if breaker.open and options.limit is not None:
            await pager.claim_rest()
        leftover = [
            i
            for i in [*result.not_started, *result.cancelled, *pager.unyielded, *worker.unstarted]
            if not lease.is_lost(i.scope, i.id)
        ]
        released: list[Item] = []
        if breaker.open:
            summary.stopped = breaker.reason or BREAKER_REASON
            await recorder.write([(i, Outcome(State.RETRYING, summary.stopped)) for i in leftover])
            summary.failed += len(leftover)
        elif leftover:
            ids = [i.id for i in leftover]
            lease.let_go(scope, ids)  # first, as the recorder does (a heartbeat in between)
            await rt.store.release(scope, ids=ids, me=lease.me)
            summary.left_pending += len(leftover)
            released = leftover
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
            await _hand_off(rt, job, period, options, summary, pager, released, until)
    finally:
        await recorder.close()
        summary.db_paused_s = round(gate.paused_s, 3)
        summary.throttles = sender.throttles + sender.pacer.throttles
        if limiter is not None:
            summary.send_rate = round(limiter.settled, 2)
            summary.send_rate_peak = round(limiter.peak, 2)


async def _hand_off(
    rt: Runtime,
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
    if rt.queue is None:
        return
    resume = min([pager.cursor, *(i.id - 1 for i in released), *(u - 1 for u in pager.foreign)])
    body = QueueMessage(
        "continuation", job.name, str(period), after_id=resume, until_id=until, limit=remaining
    ).to_json()
    try:
        await rt.queue.send([body])
    except QueueError as exc:
        log.error("could not hand the rest of %s %s on (%s); run it again", job.name, period, exc)
        return
    summary.continuation = True


async def _dry_run(
    rt: Runtime,
    job: Job,
    period: Period,
    options: Options,
    summary: Summary,
    after: int,
    until: int,
) -> None:
    """Count what a run would do: ``page``, ledger and suppression-list reads only,
    nothing written.

    A row's recipient (its ``Job.address`` column, when the page has one) is checked as
    ``send_email`` would: an invalid or suppressed address is counted skipped.
    """
    ctx, _ = rt.context(job, period, dry_run=True)
    scope = scope_of(ctx)
    fresh = not await rt.store.period_started(job=job.name, period=str(period))
    gate = _load_gate(rt, options, rt.stop)
    while True:
        limit = _page_limit(options, summary.eligible)
        if limit <= 0:
            return
        await gate.wait()
        summary.db_paused_s = round(gate.paused_s, 3)
        if rt.stop.stopping:
            return
        rows = await page(job, ctx, after, limit)
        if not rows:
            return
        after = rows[-1]["id"]
        in_range = [r for r in rows if r["id"] <= until]
        if not fresh:
            in_range = unfinished(
                in_range, await rt.store.claims_of(scope, [r["id"] for r in in_range])
            )
        summary.eligible += len(in_range)
        addresses = [r[job.address] for r in in_range if job.address in r]
        valid = [a for a in addresses if isinstance(a, str) and valid_address(a)]
        suppressed = await ctx.suppressed(valid) if valid else {}
        summary.skipped += len(addresses) - len(valid) + sum(1 for a in valid if a in suppressed)
        if options.on_progress:
            options.on_progress(Progress("done", len(in_range)))
        if len(in_range) < len(rows) or rt.stop.stopping:
            return


def _load_gate(rt: Runtime, options: Options, stop: StopToken) -> LoadGate:
    limit = options.max_db_load if options.max_db_load is not None else rt.settings.max_db_load
    return LoadGate(rt.store.db, limit, stop)


def _page_limit(options: Options, seen: int) -> int:
    if options.limit is None:
        return options.page_size
    return min(options.page_size, options.limit - seen)

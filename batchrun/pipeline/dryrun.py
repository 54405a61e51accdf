"""A dry run: what a run would do, counted from ``page``, ledger and suppression-list reads
only; nothing written, sent or queued, and neither ``prepare`` nor ``process`` called."""

from __future__ import annotations

from batchrun.job import Job
from batchrun.mail.base import valid_address
from batchrun.period import Period
from batchrun.pipeline.engine import Progress, StopToken
from batchrun.pipeline.pager import page, unfinished
from batchrun.pipeline.reports import Summary
from batchrun.pipeline.run import Options, load_gate, page_limit, scope_of
from batchrun.pipeline.wiring import Wiring


async def dry_run(
    w: Wiring,
    stop: StopToken,
    job: Job,
    period: Period,
    options: Options,
    summary: Summary,
    after: int,
    until: int,
) -> None:
    """Count the entities of (after, until] a run would take into ``summary``.

    A row's recipient (its ``Job.address`` column, when the page has one and the job
    names one) is checked as ``send_email`` would: an invalid or suppressed address is
    counted skipped.
    """
    ctx, _ = w.effects.context(job, period, stop=stop, dry_run=True)
    scope = scope_of(ctx)
    fresh = not await w.store.period_started(job=job.name, period=str(period))
    gate = load_gate(w, options, stop)
    while True:
        limit = page_limit(options, summary.eligible)
        if limit <= 0:
            return
        await gate.wait()
        summary.db_paused_s = round(gate.paused_s, 3)
        if stop.stopping:
            return
        rows = await page(job, ctx, after, limit)
        if not rows:
            return
        after = rows[-1]["id"]
        in_range = [r for r in rows if r["id"] <= until]
        past_range = len(in_range) < len(rows)  # before finished ones are left out
        if not fresh:
            in_range = unfinished(
                in_range, await w.store.claims_of(scope, [r["id"] for r in in_range])
            )
        summary.eligible += len(in_range)
        column = job.address  # None: the job sends no email, so no row skips for one
        addresses = [r[column] for r in in_range if column in r] if column else []
        valid = [a for a in addresses if isinstance(a, str) and valid_address(a)]
        suppressed = await ctx.suppressed(valid) if valid else {}
        summary.skipped += len(addresses) - len(valid) + sum(1 for a in valid if a in suppressed)
        if options.on_progress:
            options.on_progress(Progress("done", len(in_range)))
        if past_range or stop.stopping:
            return

"""``batchrun pause``, ``resume`` and ``cancel``: control rows every running process of the
job reads at its next heartbeat, whichever host it is on."""

from __future__ import annotations

from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app, no_task_period, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.control.history import History
from batchrun.control.steering import EVERY_PERIOD, Controls
from batchrun.period import parse as parse_period
from batchrun.runtime.resources import open_backends

JobArgument = Annotated[str, typer.Argument(help="The job's name (see `batchrun jobs`).")]


def _period(context: Invocation, job: str, period: str | None, *, undo: bool = False) -> str | None:
    """The period as the job writes it (2025-6 -> 2025-06); exit 2 when malformed, the
    job is unknown, or it is a task job, which has no periods (``undo``: a resume, which
    may still clear a period's row written before this was refused)."""
    found = context.registry.get_job(job)
    if period is None:
        return None
    if not undo:  # a task job is steered as a whole: a period's row would reach none
        no_task_period(found, period)
    unit = found.period
    try:
        return str(parse_period(unit, period))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--period") from None


PeriodOption = Annotated[
    str | None,
    typer.Option("--period", help="Only this period of the job; default: every period."),
]


@app.command(
    "pause",
    epilog=examples(
        'batchrun pause birthday --reason "SES complaint rate"',
        "batchrun pause renewal --period 2025-06-01",
    ),
)
def pause(
    ctx: typer.Context,
    job: JobArgument,
    period: PeriodOption = None,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Why, shown by `status`.")
    ] = None,
) -> None:
    """Pause JOB: its running processes start no new entity (those in flight finish; their
    claims stay alive) until `batchrun resume`. A run started while it is paused exits 0 at
    once and claims nothing (cron and the scheduled Lambda too); queue consumers leave its
    messages on the queue.
    """
    context: Invocation = ctx.obj

    async def go() -> int:
        which = _period(context, job, period)
        async with open_backends(context.settings) as backends:
            await Controls(backends.store.db).pause(job, which, reason)
        stderr.print(
            f"paused {job} {which or '(every period)'}: running processes hold at their next "
            "heartbeat; `batchrun resume` lets them go on",
            highlight=False,
        )
        return 0

    run_command(ctx, go)


@app.command(
    "resume",
    epilog=examples(
        "batchrun resume birthday",
        "batchrun resume renewal --period 2025-06-01",
    ),
)
def resume(ctx: typer.Context, job: JobArgument, period: PeriodOption = None) -> None:
    """Resume JOB (or one period of it) after `batchrun pause`: paused processes go on at
    their next heartbeat.
    """
    context: Invocation = ctx.obj

    async def go() -> int:
        which = _period(context, job, period, undo=True)
        async with open_backends(context.settings) as backends:
            controls = Controls(backends.store.db)
            cleared = await controls.resume(job, which)
            still = [c for c in await controls.rows() if c.job == job and c.paused]
        if not cleared:
            stderr.print(" ".join(filter(None, (job, which, "was not paused"))), highlight=False)
        else:
            stderr.print(f"resumed {job} {which or '(every period)'}", highlight=False)
        if any(c.period == EVERY_PERIOD for c in still):
            stderr.print(
                f"{job} stays paused for every period: `batchrun resume {job}` clears it",
                highlight=False,
            )
        elif still:
            periods = sorted(c.period for c in still)
            shown = ", ".join(periods[:5]) + (" ..." if len(periods) > 5 else "")
            stderr.print(
                f"{job} stays paused for {shown}: `batchrun resume {job}` clears them all",
                highlight=False,
            )
        return 0

    run_command(ctx, go)


@app.command(
    "cancel",
    epilog=examples(
        "batchrun cancel birthday",
        "batchrun cancel renewal --period 2025-06-01",
    ),
)
def cancel(ctx: typer.Context, job: JobArgument, period: PeriodOption = None) -> None:
    """Cancel the runs of JOB going on now (or of one period): at their next heartbeat they
    stop as on Ctrl-C. In-flight entities finish, the rest stay pending for a later run;
    they exit 130 (JSON `"stopped": "cancelled"`). A `retry` drain or a `worker` going on
    that works the job's messages (a task job's too) stops the same way. Runs started
    afterwards are not affected (use `batchrun pause` to keep them from starting).
    """
    context: Invocation = ctx.obj

    async def go() -> int:
        which = _period(context, job, period)
        async with open_backends(context.settings) as backends:
            db = backends.store.db
            await Controls(db).cancel(job, which)
            # Its own runs, and the workers, drains and Lambda invocations (no job of their
            # own) that may be doing its work: the cancel reaches them all.
            going = [
                r
                for r in await History(db, lease_s=context.settings.lease_s).running()
                if r.job is None or (r.job == job and which in (None, r.period))
            ]
        what = " ".join(filter(None, (job, which)))
        if going:
            stderr.print(
                f"cancelled {what}: what works on it now stops at its next heartbeat "
                f"({len(going)} run{'s' if len(going) > 1 else ''} going on)",
                highlight=False,
            )
        else:
            stderr.print(
                f"no run or worker is going on now: a cancel of {what} reaches only those "
                "(`batchrun pause` keeps runs from starting)",
                highlight=False,
            )
        return 0

    run_command(ctx, go)

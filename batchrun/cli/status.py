"""``batchrun status``: what the ledger and the queue say of one job's period."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from batchrun.backends import open_backends
from batchrun.cli.app import Context, app, period_option, run_command, stderr, stdout
from batchrun.cli.output import STATE_NAMES, table
from batchrun.cli.runs import overview, print_overview
from batchrun.cli.tasks import task_status
from batchrun.runtime.control import Steering
from batchrun.tasks import Task

SHOWN = 50


@app.command("status")
def status(
    ctx: typer.Context,
    job: Annotated[
        str | None,
        typer.Argument(help="The job's name; none: every job's last and current runs."),
    ] = None,
    period: Annotated[
        str | None, typer.Option("--period", help="The job's period; default: now (UTC).")
    ] = None,
    month: Annotated[
        str | None, typer.Option("--month", help="YYYY-MM (a month job's --period).")
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all", metavar="", help=f"List every entity not done, not only the first {SHOWN}."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON object.")
    ] = False,
) -> None:
    """Done, pending, skipped and failed entities of JOB's period, queue and dead-letter depths.

    With no job and no period: every job's last run (when, how long, outcome, counts), what
    runs now (host, pid, progress), which jobs are paused, and the queue depths. `--month`
    alone is the birthday job's month, as before.

    For a task job (batchrun.Task): its tasks pending, running, succeeded, failed (waiting
    for another attempt) and dead, and oldest_pending_s.

    \b
    Examples:
      batchrun status
      batchrun status birthday --month 2025-06
      batchrun status renewal --period 2025-06-01 --json
    """
    context: Context = ctx.obj
    settings = context.settings
    if job is None and period is None and month is None:
        run_command(ctx, lambda: _overview(context, as_json))
        return
    name = job or "birthday"

    async def go() -> int:
        job = name
        entry = context.registry.entry(job)
        if isinstance(entry.job, Task):  # pending, running, succeeded, failed, dead tasks
            tasks = await task_status(context, entry.job)
            if as_json:
                print(json.dumps(tasks))
            else:
                table(f"status {job}", tasks)
            return 0
        unit = entry.job.period
        which = period_option(unit, period or month, "--period" if period else "--month")
        async with open_backends(settings, queue=True, jobs=[entry.job]) as backends:
            assert backends.queue is not None
            limit = 10**9 if show_all else SHOWN
            counts = await context.runtime(backends).status(job, which, problems=limit + 1)
            depth, dead = await backends.queue.depths()
            steering = Steering()
            await steering.refresh(backends.store.db)
            held = steering.paused(job, str(which))
        problems: list[tuple[int, int, int, str | None]] = counts.pop("problems")
        more = max(0, len(problems) - limit)
        problems = problems[:limit]
        data: dict[str, Any] = {"job": job, "period": str(which)}
        if unit == "month":
            data["month"] = str(which)
        if job == "birthday":
            data["cards"] = counts.pop("cards", 0)
            data["emails_sent"] = counts.pop("succeeded")
        data.update(counts)
        data.update(
            retry_queue_depth=depth,
            dead_letter_depth=dead,
            problems=[
                {
                    "id": uid,
                    "user_id": uid,
                    "state": STATE_NAMES.get(state, str(state)),
                    "attempts": attempts,
                    "reason": reason,
                }
                for uid, state, attempts, reason in problems
            ],
            problems_not_listed=more,
        )
        if held is not None:  # only when paused: `batchrun pause`
            data["paused"] = True
            data["paused_reason"] = held.reason
        if as_json:
            print(json.dumps(data))
            return 0
        table(
            f"status {job} {which}", {k: v for k, v in data.items() if not k.startswith("problems")}
        )
        if problems:
            out = Table("id", "state", "attempts", "reason", title="entities not done")
            for p in data["problems"]:
                # Text, not markup: a reason may hold "[/path]" (an error's own words).
                reason = Text(p["reason"] or "")
                out.add_row(str(p["id"]), p["state"], str(p["attempts"]), reason)
            stdout.print(out)
        if more:
            stdout.print(f"… and {more} more (`batchrun status --all` lists them)", highlight=False)
        return 0

    run_command(ctx, go)


async def _overview(context: Context, as_json: bool) -> int:
    data = await overview(context)
    await _note_missing_tables(context)
    if as_json:
        print(json.dumps(data))
    else:
        print_overview(data)
    return 0


async def _note_missing_tables(context: Context) -> None:
    """A note for each job whose tables are not in this database (exit 0 all the same)."""
    entries = list(context.registry.values())
    async with open_backends(context.settings, jobs=[e.job for e in entries]) as backends:
        for entry in entries:
            missing = await backends.store.missing_requirements(entry.job)
            if missing is not None:
                stderr.print(f"note: {missing}", highlight=False, soft_wrap=True)

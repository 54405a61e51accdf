"""``batchrun status``: what the ledger and the queue say of one job's period."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from batchrun.backends import open_backends
from batchrun.cli.app import Context, app, period_option, run_command
from batchrun.cli.conventions import examples, print_table, stdout
from batchrun.cli.output import STATE_NAMES, table

SHOWN = 50


@app.command(
    "status",
    epilog=examples(
        "batchrun status --month 2025-06",
        "batchrun status renewal --period 2025-06-01 --all",
        "batchrun status birthday --period 2025-06 --json",
    ),
)
def status(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job's name.")] = "birthday",
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
    """Done, pending, skipped and failed entities of JOB's period, queue and dead-letter depths."""
    context: Context = ctx.obj
    settings = context.settings

    async def go() -> int:
        entry = context.registry.entry(job)
        unit = entry.job.period
        which = period_option(unit, period or month, "--period" if period else "--month")
        async with open_backends(settings, queue=True, jobs=[entry.job]) as backends:
            assert backends.queue is not None
            limit = 10**9 if show_all else SHOWN
            counts = await context.runtime(backends).status(job, which, problems=limit)
            depth, dead = await backends.queue.depths()
        problems: list[tuple[int, int, int, str | None]] = counts.pop("problems")[:limit]
        not_done = sum(int(counts.get(k) or 0) for k in ("skipped", "retrying", "failed_permanent"))
        more = max(0, not_done - len(problems))  # every one the ledger lists, not one past it
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
        if as_json:
            print(json.dumps(data))
            return 0
        table(
            f"status {job} {which}", {k: v for k, v in data.items() if not k.startswith("problems")}
        )
        if problems:
            print_table(
                ("id", "state", "attempts", "reason"),
                [(p["id"], p["state"], p["attempts"], p["reason"]) for p in data["problems"]],
                title="entities not done",
            )
        if more:
            stdout.print(
                f"… and {more} more (`batchrun status {job} --period {which} --all` lists them)",
                highlight=False,
            )
        return 0

    run_command(ctx, go)

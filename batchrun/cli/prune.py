"""``batchrun prune``: the run history and ended tasks older than a cutoff, deleted."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, stdout
from batchrun.cli.runs import since_ms
from batchrun.control.prune import prune
from batchrun.control.timeline import iso
from batchrun.runtime.resources import open_backends

AGE = "90d|YYYY-MM-DD|never"


@app.command(
    "prune",
    epilog=examples(
        "batchrun prune --dry-run",
        "batchrun prune --runs 30d --tasks never --json",
        "# daily from cron: 15 3 * * * batchrun prune",
    ),
)
def prune_command(
    ctx: typer.Context,
    runs: Annotated[
        str,
        typer.Option(
            "--runs",
            metavar=AGE,
            help="Delete the run history (batchrun runs) of runs over before then: every "
            "run, retry, worker, Lambda invocation and events drain. 'never' keeps it all.",
        ),
    ] = "90d",
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks",
            metavar=AGE,
            help="Delete the submitted tasks that ended (succeeded or dead) before then. A "
            "key pruned and submitted again runs again. 'never' keeps them all.",
        ),
    ] = "90d",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON object.")
    ] = False,
) -> None:
    """Delete the run history and the ended submitted tasks older than a cutoff.

    Both grow for ever otherwise: a row per run, worker and Lambda invocation (one per SQS
    batch), and one per task. Deleted 1,000 rows a statement, so a production database
    holds no long lock. Kept: the runs going on (a heartbeat within two leases, whatever
    the cutoff), each job's newest run of each kind and outcome (so `status` and the
    metrics still tell its last success), every task not ended (pending, running,
    failed and waiting for its retry), the ledger (which keeps an entity done once per
    period) and the suppression list. --json: {"runs", "tasks", "dry_run", "runs_before",
    "tasks_before"} (counts of rows; a cutoff is null for 'never').
    """
    context: Invocation = ctx.obj
    runs_before = None if runs.strip() == "never" else since_ms(runs, hint="--runs")
    tasks_before = None if tasks.strip() == "never" else since_ms(tasks, hint="--tasks")

    async def go() -> int:
        async with open_backends(context.settings) as backends:
            pruned = await prune(
                backends.store.db,
                runs_before=runs_before,
                tasks_before=tasks_before,
                dry_run=dry_run,
                lease_s=context.settings.lease_s,
            )
        if as_json:
            result = {
                "runs": pruned.runs,
                "tasks": pruned.tasks,
                "dry_run": dry_run,
                "runs_before": None if runs_before is None else iso(runs_before),
                "tasks_before": None if tasks_before is None else iso(tasks_before),
            }
            print(json.dumps(result))
            return 0
        verb = "would delete" if dry_run else "deleted"
        parts = [
            f"{_rows(pruned.runs, 'run')} over before {iso(runs_before)}" if runs_before else "",
            f"{_rows(pruned.tasks, 'task')} ended before {iso(tasks_before)}"
            if tasks_before
            else "",
        ]
        said = " and ".join(p for p in parts if p) or "nothing (both kept: never)"
        stdout.print(f"{verb} {said}", highlight=False)
        return 0

    run_command(ctx, go)


def _rows(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"

"""``batchrun why``: one entity's story, in time order (control/story.py tells it)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app, no_task_period, period_option, run_command
from batchrun.cli.conventions import examples, print_table, stdout
from batchrun.control import story
from batchrun.control.timeline import iso
from batchrun.db.store import MAX_ID
from batchrun.runtime.resources import open_backends


@app.command(
    "why",
    epilog=examples(
        "batchrun why birthday 42 --period 2025-06",
        "batchrun why birthday 42 --json",
        "batchrun why transcode 7",
    ),
)
def why(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job's name.")],
    entity: Annotated[
        int, typer.Argument(metavar="ID", min=1, max=MAX_ID, help="The entity's id.")
    ],
    period: Annotated[
        str | None,
        typer.Option("--period", help="The job's period; default: now (UTC). Not for a task job."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON object.")
    ] = False,
) -> None:
    """Tell what became of entity ID in JOB's period, in time order.

    Whether a run would take it now (and why not: not in the job's page, an invalid or
    suppressed address), its ledger state, attempts and last error, the Message-ID of its
    email and when it was accepted (if an email went out), bounces, complaints and
    unsubscribes, its messages of that period on the retry or dead-letter queue, and the run
    that did each step. For a task job: the entity's submitted tasks (submitted, sent
    again, started, succeeded, failed with the time of its retry, dead) and its messages.
    Reads only.
    """
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        entry = context.registry.entry(job)
        no_task_period(entry.job, period)
        which = period_option(entry.job.period, period, "--period")
        async with open_backends(settings, queue=True, jobs=[entry.job]) as backends:
            told = await story.tell(context.runtime(backends).wiring, entry.job, which, entity)
        if as_json:
            print(json.dumps(told.to_json()))
            return 0
        if told.of_tasks:
            head = "a task unfinished" if told.eligible else "no task unfinished"
            where = f"{told.job} entity {told.entity_id}: {head}, task state"
        else:
            head = "eligible now" if told.eligible else "not eligible now"
            where = f"{told.job} {told.period} entity {told.entity_id}: {head}, ledger state"
        stdout.print(f"{where} {told.state or '(none)'}", highlight=False)
        print_table(
            ("at (UTC)", "what", "detail", "run"),
            [(iso(e.at), e.what, e.detail, e.run_id) for e in told.events],
        )
        return 0

    run_command(ctx, go)

"""``batchrun status``: what the ledger and the queue say of one job's period."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from batchrun.cli.app import Invocation, app, no_task_period, period_option, run_command
from batchrun.cli.conventions import examples, print_table, stderr, stdout
from batchrun.cli.output import STATE_NAMES, table
from batchrun.cli.runs import overview, print_overview
from batchrun.cli.tasks import task_status
from batchrun.control.steering import Steering
from batchrun.db.store import Store
from batchrun.job import Job
from batchrun.period import parse as parse_period
from batchrun.registry import JobEntry
from batchrun.runtime.resources import open_backends
from batchrun.tasks import Task

SHOWN = 50


@app.command(
    "status",
    epilog=examples(
        "batchrun status",
        "batchrun status --month 2025-06",
        "batchrun status renewal --period 2025-06-01 --all",
        "batchrun status birthday --period 2025-06 --json",
    ),
)
def status(
    ctx: typer.Context,
    job: Annotated[
        str | None,
        typer.Argument(
            help="The job's name; none and no period: every job's last and current runs; "
            "none with a period: every job of that period whose tables are in the database "
            "(the others are skipped with a note)."
        ),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option("--period", help="The job's period; default: now (UTC). Not for a task job."),
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
    runs now (host, pid, progress), which jobs are paused, and the queue depths.

    For a task job (batchrun.Task): its tasks pending, running, claimed_by_stopped_run
    (started by a process that died: they run again once their message comes back),
    succeeded, failed (waiting for another attempt) and dead, and oldest_pending_s.

    With no job and a period: each job of that period whose tables are in the database, in
    turn (--json: the one job's object, or {"jobs": {name: object}} for several).
    """
    context: Invocation = ctx.obj
    settings = context.settings
    if job is None and period is None and month is None:
        run_command(ctx, lambda: _overview(context, as_json))
        return

    async def go() -> int:
        if job is not None:
            entries = [context.registry.entry(job)]
            no_task_period(entries[0].job, period or month, "--period" if period else "--month")
            if isinstance(entries[0].job, Task):  # pending, running, succeeded, failed, dead
                tasks = await task_status(context, entries[0].job)
                if as_json:
                    print(json.dumps(tasks))
                else:
                    table(f"status {job}", tasks)
                return 0
        else:
            entries = [
                e
                for e in _of_period(list(context.registry.values()), period or month)
                if not isinstance(e.job, Task)
            ]
        # Each period is read before anything opens: a bad one is a usage error (exit 2).
        periods = {
            e.job.name: period_option(
                e.job.period, period or month, "--period" if period else "--month"
            )
            for e in entries
        }
        async with open_backends(settings, queue=True, jobs=[e.job for e in entries]) as backends:
            assert backends.queue is not None
            if job is None:
                entries = await _with_tables(backends.store, entries)
            limit = 10**9 if show_all else SHOWN
            steering = Steering()
            await steering.refresh(backends.store.db)
            reports = []
            for entry in entries:
                name = entry.job.name
                which = periods[name]
                counts = await context.runtime(backends).status(name, which, problems=limit)
                depth, dead = await backends.queue.depths()
                data = _report(entry.job, str(which), counts, depth, dead, limit)
                data.update(steering.paused_keys(name, str(which)))  # while paused only
                reports.append(data)
        if as_json:
            if len(reports) == 1:
                print(json.dumps(reports[0]))
            else:
                print(json.dumps({"jobs": {r["job"]: r for r in reports}}))
            return 0
        for data, entry in zip(reports, entries, strict=True):
            # A count the job shows under its own name (birthday's emails_sent) once
            shown_as = {k for k, name in entry.job.status_names.items() if name != k}
            _print({k: v for k, v in data.items() if k not in shown_as})
        return 0

    run_command(ctx, go)


async def _overview(context: Invocation, as_json: bool) -> int:
    data = await overview(context)
    await _note_missing_tables(context)
    if as_json:
        print(json.dumps(data))
    else:
        print_overview(data)
    return 0


def _of_period(entries: list[JobEntry], text: str | None) -> list[JobEntry]:
    """The entries whose period ``text`` names (all when it is None); the first entry
    when none does, so that its period says what is wrong with ``text``."""
    if text is None:
        return entries
    fitting = []
    for entry in entries:
        try:
            parse_period(entry.job.period, text)
        except ValueError:
            continue
        fitting.append(entry)
    return fitting or entries[:1]


async def _with_tables(store: Store, entries: list[JobEntry]) -> list[JobEntry]:
    """The entries whose job's tables are in the database; a note for each of the others."""
    usable = []
    for entry in entries:
        missing = await store.missing_requirements(entry.job)
        if missing is None:
            usable.append(entry)
        else:
            stderr.print(f"note: not shown: {missing}", highlight=False, soft_wrap=True)
    if not usable:
        stderr.print("note: no job has its tables in this database", highlight=False)
    return usable


def _report(
    job: Job,
    period: str,
    counts: dict[str, Any],
    depth: int,
    dead: int | None,
    limit: int,
) -> dict[str, Any]:
    """The JSON object of one job's status."""
    problems: list[tuple[int, int, int, str | None]] = counts.pop("problems")[:limit]
    not_done = sum(int(counts.get(k) or 0) for k in ("skipped", "retrying", "failed_permanent"))
    more = max(0, not_done - len(problems))  # every one the ledger lists, not one past it
    data: dict[str, Any] = {"job": job.name, "period": period}
    if job.period == "month":
        data["month"] = period
    for key, name in job.status_names.items():  # the job's own names go first; the
        if key in counts:  # common ones stay too, so a script reads every job alike
            data[name] = counts[key]
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
    return data


def _print(data: dict[str, Any]) -> None:
    """One job's status as tables, for a person."""
    title = f"status {data['job']} {data['period']}"
    table(title, {k: v for k, v in data.items() if not k.startswith("problems")})
    if data["problems"]:
        print_table(
            ("id", "state", "attempts", "reason"),
            [(p["id"], p["state"], p["attempts"], p["reason"]) for p in data["problems"]],
            title="entities not done",
        )
    if more := data["problems_not_listed"]:
        stdout.print(
            f"… and {more} more (`batchrun status {data['job']} --period {data['period']} "
            "--all` lists them)",
            highlight=False,
        )


async def _note_missing_tables(context: Invocation) -> None:
    """A note for each job whose tables are not in this database (exit 0 all the same)."""
    entries = list(context.registry.values())
    async with open_backends(context.settings, jobs=[e.job for e in entries]) as backends:
        for entry in entries:
            missing = await backends.store.missing_requirements(entry.job)
            if missing is not None:
                stderr.print(f"note: {missing}", highlight=False, soft_wrap=True)

"""``batchrun submit`` (a task job's and a period job's), ``batchrun status`` of a task job."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.cli.task_file import Submission, TaskFile, from_file, from_options
from batchrun.control.steering import Steering
from batchrun.db.store import MAX_ID
from batchrun.errors import UsageError
from batchrun.period import parse as parse_period
from batchrun.runtime.resources import open_backends
from batchrun.task import BadTask, Task
from batchrun.tasks.store import TaskStore
from batchrun.tasks.submit import Submitted, submit_many

Json = Annotated[
    bool,
    typer.Option(
        "--json",
        metavar="",
        help="Print one JSON summary on stdout (for a task job, one JSON line a task).",
    ),
]
STATUS_KEYS = (
    "pending",
    "running",
    "claimed_by_stopped_run",  # running in a process that died: runs again later
    "succeeded",
    "failed",
    "dead",
    "oldest_pending_s",
)


async def submit_task(
    context: Invocation,
    job: Task,
    tasks: list[Submission],
    as_json: bool,
    *,
    single: bool,
) -> int:
    """Queue ``tasks`` of ``job``; print each one's key (or its JSON line) as it is queued,
    so what went before an error is on stdout. Everything was checked before (exit 2)."""
    if not tasks:
        stderr.print(f"{job.name}: no tasks given: nothing queued", highlight=False)
        return 0

    def show(settled: list[Submitted]) -> None:
        for one in settled:
            try:
                print(json.dumps(one.as_json()) if as_json else one.key, flush=True)
            except BrokenPipeError:
                # The reader went away (`| head -1`): the rest is queued all the same.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    try:
        async with open_backends(context.settings, queue=True, jobs=[job]) as backends:
            assert backends.queue is not None
            done = await submit_many(
                backends.store.db,
                backends.queue,
                job,
                tasks,
                resend_after_s=context.settings.task_resend_s,
                on_sent=show,
            )
    except BadTask as exc:
        # A key another entity has: say the line of the file that gives it.
        where = tasks.where(exc.key) if isinstance(tasks, TaskFile) else None
        raise UsageError(f"{where}: {exc}" if where else str(exc)) from None
    if as_json:
        return 0
    resent = [d for d in done if d.resent]
    before = [d for d in done if not d.queued and not d.resent]
    if not single:
        stderr.print(
            f"{job.name}: {_tasks(len(done) - len(resent) - len(before))} queued,"
            f" {len(before)} submitted before (nothing queued), {len(resent)} sent again",
            highlight=False,
        )
    elif resent:  # a key may hold [brackets]: no markup
        stderr.print(
            f"task {resent[0].key} was submitted before but never started: sent again",
            highlight=False,
            markup=False,
        )
    elif before:
        stderr.print(
            f"task {before[0].key} was submitted before: nothing queued",
            highlight=False,
            markup=False,
        )
    return 0


def _tasks(count: int) -> str:
    return f"{count} task" if count == 1 else f"{count} tasks"


async def task_status(context: Invocation, job: Task) -> dict[str, Any]:
    """``status TASKJOB``: the tasks in each state now, and the oldest one's wait; while
    the job is paused, ``paused`` and ``paused_reason``, as a period job's status says."""
    async with open_backends(context.settings, jobs=[job]) as backends:
        counts = await TaskStore(backends.store.db).counts(job.name)
        steering = Steering()
        await steering.refresh(backends.store.db)
    data: dict[str, Any] = {"job": job.name, **{k: counts[k] for k in STATUS_KEYS}}
    return {**data, **steering.paused_keys(job.name, None)}


@app.command(
    "submit",
    epilog=examples(
        "batchrun submit birthday --period 2025-06 --id 42",
        'batchrun submit uploads --id 7 --data \'{"kind": "scan", "upload_id": 9}\'',
        "batchrun submit uploads --id 7 --key upload-991 --json",
        "batchrun submit uploads --file tasks.jsonl",
    ),
)
def submit(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job's name.")],
    ids: Annotated[
        list[int] | None,
        typer.Option("--id", min=1, max=MAX_ID, help="An entity id; repeat for more."),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option("--period", help="The job's period, e.g. 2025-06 (not for a task job)."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="A task job's task key: a key submitted before is a no-op, unless its task"
            " never started BATCHRUN_TASK_RESEND_S (300) later: its message is sent again.",
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            metavar="JSON",
            help="A task job's data: a JSON object, 200 KB at most, or @FILE to read it from FILE.",
        ),
    ] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            metavar="FILE",
            help='A task job\'s tasks as JSON Lines, one {"entity_id", "data", "key"} a line'
            " (data and key optional); - reads standard input. Instead of --id.",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Queue work for the queue consumers (`retry`, `worker`, the Lambda).

    For a task job (batchrun.Task): one task for each --id, printed as its key (a new
    one unless --key is given); with --json {"job", "entity_id", "key", "queued"} (one
    line a task). A key submitted before queues nothing ("queued": false). One entity's
    tasks run one at a time, in submission order. --file gives many tasks, each with its
    own data and key: a bad line is refused (exit 2) before anything is queued, and a
    file whose every line has a key can be submitted again after an error.

    For a period job (--period): one task per entity. Two tasks for one entity never run
    at once, and an entity is done at most once per period: a second submit of a
    finished entity does nothing.
    """
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        entry = context.registry.entry(job)
        if isinstance(entry.job, Task):
            if period is not None:
                raise UsageError(f"{job} is a task job: it takes no --period")
            if file is None:
                if not ids:
                    raise UsageError(f"{job} is a task job: give --id, or --file")
                tasks = from_options(ids, data, key)
            elif ids or key is not None or data is not None:
                raise UsageError("--file gives every task: leave out --id, --key and --data")
            else:
                tasks = from_file(file)  # read whole, before connecting
            single = file is None and len(tasks) == 1
            return await submit_task(context, entry.job, tasks, as_json, single=single)
        if file is not None:
            raise UsageError(f"{job} is a period job: --file is for task jobs; give --id")
        if not ids:
            raise UsageError(f"{job} is a period job: give --id")
        if period is None:
            raise UsageError(f"{job} is a period job: give --period")
        if key is not None or data is not None:
            raise UsageError(f"{job} is a period job: --key and --data are for task jobs")
        try:
            which = parse_period(entry.job.period, period)
        except ValueError as exc:
            raise UsageError(f"--period: {exc}") from None
        async with open_backends(settings, queue=True, jobs=[entry.job]) as backends:
            queued = await context.runtime(backends).submit(job, which, ids)
        result = {"job": job, "period": str(which), "queued": queued}
        if as_json:
            print(json.dumps(result))
        else:
            stderr.print(f"queued {queued} {job} tasks for {which}", highlight=False)
        return 0

    run_command(ctx, go)

"""``batchrun submit`` (a task job's and a period job's), ``batchrun status`` of a task job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.errors import UsageError
from batchrun.period import parse as parse_period
from batchrun.runtime.resources import open_backends
from batchrun.task import BadTask, Task, checked
from batchrun.tasks.store import TaskStore
from batchrun.tasks.submit import submit as submit_one

Json = Annotated[bool, typer.Option("--json", metavar="", help="Print one JSON summary on stdout.")]
STATUS_KEYS = ("pending", "running", "succeeded", "failed", "dead", "oldest_pending_s")


async def submit_task(
    context: Invocation, job: Task, ids: list[int], key: str | None, data: str | None, as_json: bool
) -> int:
    """Queue one task of ``job``; print its key (or the JSON line). Refused with one line
    (exit 2) before anything is queued: data not a JSON object, over 200 KB, a bad key."""
    if len(ids) != 1:
        raise UsageError(f"{job.name} is a task job: give one --id")
    if data is not None and data.startswith("@"):  # @FILE: the JSON in a file
        try:
            data = Path(data[1:]).read_text(encoding="utf-8")  # noqa: ASYNC240 (one small file)
        except OSError as exc:
            raise UsageError(f"--data {data}: {exc.strerror}") from None
    try:
        parsed: Any = None if data is None else json.loads(data)
    except ValueError as exc:
        raise UsageError(f"--data is not JSON: {exc}") from None
    try:
        checked(ids[0], parsed, key)  # before connecting to anything
        async with open_backends(context.settings, queue=True, jobs=[job]) as backends:
            assert backends.queue is not None
            done = await submit_one(
                backends.store.db,
                backends.queue,
                job,
                ids[0],
                parsed,
                key,
                resend_after_s=context.settings.task_resend_s,
            )
    except BadTask as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        print(json.dumps(done.as_json()))
    else:
        print(done.key)
        if done.resent:
            stderr.print(
                f"task {done.key} was submitted before but never started: sent again",
                highlight=False,
            )
        elif not done.queued:
            stderr.print(f"task {done.key} was submitted before: nothing queued", highlight=False)
    return 0


async def task_status(context: Invocation, job: Task) -> dict[str, Any]:
    """``status TASKJOB``: the tasks in each state now, and the oldest one's wait."""
    async with open_backends(context.settings, jobs=[job]) as backends:
        counts = await TaskStore(backends.store.db).counts(job.name)
    return {"job": job.name, **{k: counts[k] for k in STATUS_KEYS}}


@app.command(
    "submit",
    epilog=examples(
        "batchrun submit birthday --period 2025-06 --id 42",
        'batchrun submit uploads --id 7 --data \'{"kind": "scan", "upload_id": 9}\'',
        "batchrun submit uploads --id 7 --key upload-991 --json",
    ),
)
def submit(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job's name.")],
    ids: Annotated[list[int], typer.Option("--id", min=1, help="An entity id; repeat for more.")],
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
    as_json: Json = False,
) -> None:
    """Queue work for the queue consumers (`retry`, `worker`, the Lambda).

    For a task job (batchrun.Task): one task for entity --id, printed as its key (a new
    one unless --key is given); with --json {"job", "entity_id", "key", "queued"}. A key
    submitted before queues nothing ("queued": false). One entity's tasks run one at a
    time, in submission order.

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
            return await submit_task(context, entry.job, ids, key, data, as_json)
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

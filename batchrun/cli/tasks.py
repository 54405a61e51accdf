"""``batchrun submit`` and ``batchrun status`` for a ``batchrun.Task`` job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchrun.backends import open_backends
from batchrun.cli.app import Context, stderr
from batchrun.errors import UsageError
from batchrun.tasks.store import TaskStore
from batchrun.tasks.submit import submit
from batchrun.tasks.task import BadTask, Task, checked

STATUS_KEYS = ("pending", "running", "succeeded", "failed", "dead", "oldest_pending_s")


async def submit_task(
    context: Context, job: Task, ids: list[int], key: str | None, data: str | None, as_json: bool
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
            done = await submit(backends.store.db, backends.queue, job, ids[0], parsed, key)
    except BadTask as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        print(json.dumps(done.as_json()))
    else:
        print(done.key)
        if not done.queued:
            stderr.print(f"task {done.key} was submitted before: nothing queued", highlight=False)
    return 0


async def task_status(context: Context, job: Task) -> dict[str, Any]:
    """``status TASKJOB``: the tasks in each state now, and the oldest one's wait."""
    async with open_backends(context.settings, jobs=[job]) as backends:
        counts = await TaskStore(backends.store.db).counts(job.name)
    return {"job": job.name, **{k: counts[k] for k in STATUS_KEYS}}

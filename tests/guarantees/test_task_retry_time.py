"""A failed task starts again no earlier than its retry time (``retry_at``, on the
database server's clock), whichever of its messages comes first: its own, hidden for the
delay, or a second one (a duplicate delivery, or a copy sent again while it waited)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from support.cli import run_cli
from support.tasks import JOBS, effects, migrate_task_jobs

import batchrun
from batchrun.db import connect
from batchrun.queue.base import QueueMessage
from batchrun.queue.local import LocalQueue
from batchrun.tasks.store import TaskState, TaskStore


async def test_a_failed_task_starts_no_earlier_than_its_retry_time(store: Any) -> None:
    tasks = TaskStore(store.db)
    assert await tasks.submit("steps", 1, "r1", "{}")
    row = await tasks.get("steps", "r1")
    assert row is not None and row.retry_at is None
    now = await store.db.clock_ms()
    assert await tasks.start_many([row.id], "A", now + 10_000, now) == {row.id}
    assert await tasks.finish(row.id, "A", TaskState.FAILED, "boom", retry_at=now + 60_000)
    failed = await tasks.get("steps", "r1")
    assert failed is not None and (failed.state, failed.retry_at) == (
        TaskState.FAILED,
        now + 60_000,
    )
    assert (await tasks.get_many("steps", ["r1"]))["r1"].retry_at == now + 60_000
    assert not await tasks.start(row.id, "B", 30.0)  # one at a time, on the server's clock
    assert await tasks.start_many([row.id], "B", now + 69_000, now + 59_999) == set()  # a batch
    assert await tasks.start_many([row.id], "B", now + 70_000, now + 60_000) == {row.id}
    assert await tasks.finish_many([row.id], "B", TaskState.SUCCEEDED) == {row.id}
    done = await tasks.get("steps", "r1")
    assert done is not None and (done.state, done.retry_at) == (TaskState.SUCCEEDED, None)


def _send_twice(db_url: str, message: QueueMessage) -> None:
    """A second copy of a task's message on the local queue: a duplicate delivery."""

    async def send() -> None:
        db = await connect(db_url)
        try:
            await LocalQueue(db).send([message.to_json()])
        finally:
            await db.close()

    asyncio.run(send())


def test_a_second_message_of_a_failed_task_waits_for_its_retry_time(db_url: str) -> None:
    """End to end, on each database: the task's two messages come in one batch; its first
    attempt fails asking for 2 s; the second message must not start it before then (it did,
    at once, before ``retry_at``), and the task runs twice in all: once failed, once done."""
    env = migrate_task_jobs(db_url)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        client.submit("flaky", 1, key="d1", data={"retry_s": 2})
    _send_twice(db_url, QueueMessage("entity_task", "flaky", "", entity_id=1, key="d1"))
    served = run_cli("worker", "--idle-exit", "5", "--json", env=env, timeout=120)
    assert served.returncode in (0, 1), served.stderr
    starts = sorted(r[3] for r in effects(db_url))
    assert len(starts) == 2, starts  # the failed attempt, then the one that succeeded
    assert (starts[1] - starts[0]) / 1e9 >= 1.95  # not before the 2 s it asked for
    status = json.loads(run_cli("status", "flaky", "--json", env=env).stdout)
    assert (status["succeeded"], status["failed"], status["pending"]) == (1, 0, 0), status

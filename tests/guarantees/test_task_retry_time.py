"""A failed task starts again no earlier than its retry time (``retry_at``, on the
database server's clock), whichever of its messages comes first: its own, hidden for the
delay, or a second one (a duplicate delivery, or a copy sent again while it waited)."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import pytest
from support.cli import run_cli
from support.db import query
from support.tasks import JOBS, StepsTask, effects, migrate_task_jobs

import batchrun
from batchrun.db import connect
from batchrun.pipeline.task_claim import first_wave
from batchrun.pipeline.tasks import RETRY_WAIT, WAITING, _item, turn_wait
from batchrun.queue.base import QueueMessage, Received
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


@pytest.mark.parametrize("prefetch", ["1", "10"])
def test_a_second_message_of_a_failed_task_waits_for_its_retry_time(
    db_url: str, prefetch: str
) -> None:
    """End to end, on each database: the task's message is on the queue twice. Its first
    attempt fails asking for 3 s; the other message, in the same batch (``--prefetch
    10``, ``TaskRoad._next``) or the next (``first_wave``), must not start it before then
    (it did, at once). Both messages wait until the retry time, without holding the
    worker's idle exit; a later worker runs the task once more, and only once."""
    env = migrate_task_jobs(db_url)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        client.submit("flaky", 1, key="d1", data={"retry_s": 3})
    _send_twice(db_url, QueueMessage("entity_task", "flaky", "", entity_id=1, key="d1"))
    args = ("worker", "--prefetch", prefetch, "--json")
    first = run_cli(*args, "--idle-exit", "1", env=env, timeout=120)
    assert first.returncode in (0, 1), first.stderr
    assert len(effects(db_url)) == 1  # the failed attempt only
    retry_at = query(db_url, "SELECT retry_at FROM batchrun_entity_task")[0][0]
    waiting = query(db_url, "SELECT visible_at, receive_count FROM batchrun_queue")
    assert len(waiting) == 2, waiting
    for visible_at, receives in waiting:  # each back once its time comes, not before
        assert int(visible_at) >= int(retry_at) - 100 and int(receives) == 1, (retry_at, waiting)

    second = run_cli(*args, "--idle-exit", "5", env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    starts = sorted(r[3] for r in effects(db_url))
    assert len(starts) == 2, starts  # the failed attempt, then the one that succeeded
    assert (starts[1] - starts[0]) / 1e9 >= 2.95  # not before the 3 s it asked for
    status = json.loads(run_cli("status", "flaky", "--json", env=env).stdout)
    assert (status["succeeded"], status["failed"], status["pending"]) == (1, 0, 0), status


async def test_only_the_failed_tasks_own_messages_wait_for_its_retry_time(store: Any) -> None:
    """A batch holds a copy of failed task A's message, then task B's of the same entity:
    A's waits until A's retry time; B's waits only its turn (its short wait), also when
    the job runs one entity's tasks in parallel (``serial = "none"``)."""
    tasks = TaskStore(store.db)
    for key in ("a", "b"):
        assert await tasks.submit("steps", 1, key, "{}")
    a = await tasks.get("steps", "a")
    assert a is not None
    now = await store.db.clock_ms()
    assert await tasks.start_many([a.id], "A", now + 10_000, now) == {a.id}
    assert await tasks.finish(a.id, "A", TaskState.FAILED, "boom", retry_at=now + 3_600_000)

    for serial in ("entity", "none"):
        job = StepsTask()
        job.serial = serial  # type: ignore[misc]
        messages = [QueueMessage("entity_task", "steps", "", entity_id=1, key=k) for k in "ab"]
        group = deque((Received(m.key, m.key, m.to_json(), 1), m) for m in messages)
        found: dict[str, Any] = {}
        wave = await first_wave(
            tasks,
            job,
            {1: group},
            me="B",
            lease_ms=10_000,
            turns=set(),
            running={},
            found=found,
            wait=turn_wait,
            item=_item,
        )
        assert wave == {1: None}, serial
        assert (found["a"].reason, found["a"].awaited) == (RETRY_WAIT, False), serial
        assert found["a"].delay_s > 3_500, serial  # about an hour
        assert (found["b"].reason, found["b"].awaited) == (WAITING, True), serial
        assert found["b"].delay_s < 2, serial

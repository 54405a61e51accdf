"""A submitted task whose submitter died after writing its row and before sending its
message: sent again once it looks lost (never started, older than
``BATCHRUN_TASK_RESEND_S``), by a resubmission of its key or by a consumer whose messages
wait behind it; one process sends it each period, and a task that ever started is never
sent again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pytest
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.cli import run_cli
from support.db import query
from support.lambda_context import FakeContext, drain_as_sqs_events
from support.tasks import JOBS, RefusingQueue, StepsTask, effects, migrate_task_jobs

import batchrun
from batchrun import aws_lambda
from batchrun.control.steering import Control
from batchrun.db import connect
from batchrun.db.base import Database
from batchrun.errors import QueueError
from batchrun.pipeline.engine import StopToken
from batchrun.queue.base import WorkQueue
from batchrun.queue.local import LocalQueue
from batchrun.runtime import Runtime
from batchrun.settings import Settings
from batchrun.tasks import resend, sweep
from batchrun.tasks.resend import LostTaskSweep
from batchrun.tasks.store import TaskState, TaskStore
from batchrun.tasks.submit import submit
from batchrun.tasks.sweep import sweep_idle


@pytest.fixture(autouse=True)
def _no_looks_yet() -> Iterator[None]:
    """Each test starts with no look-out history (it is kept per process)."""
    resend._LOOKED.clear()
    resend._WAITING.clear()
    sweep._SWEPT.clear()
    sweep._CURSOR.clear()
    yield


async def _queued(store: Any) -> list[str]:
    """The keys of the task messages on the local queue."""
    rows = await store.db.fetch_sql("SELECT body FROM batchrun_queue ORDER BY id", ())
    return [json.loads(r[0])["key"] for r in rows]


async def _queued_kinds(store: Any) -> list[str]:
    """Each message on the local queue: its task key, or its kind for any other."""
    rows = await store.db.fetch_sql("SELECT body FROM batchrun_queue ORDER BY id", ())
    return [json.loads(r[0]).get("key") or json.loads(r[0])["kind"] for r in rows]


async def _age(db: Database, key: str, by_s: float) -> None:
    """Back-date a submission, as if it were made ``by_s`` seconds ago."""
    await db.execute_sql(
        f"UPDATE batchrun_entity_task SET created_at = created_at - {int(by_s * 1000)}"
        f" WHERE task_key = '{key}'",
        (),
    )


async def test_a_resubmission_sends_a_lost_message_again_once_a_period(store: Any) -> None:
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    assert await tasks.submit("steps", 5, "k1", "{}")  # written; its submitter died here
    young = await submit(store.db, queue, StepsTask(), 5, key="k1", resend_after_s=60)
    assert (young.queued, young.resent) == (False, False)  # not yet taken for lost
    assert await _queued(store) == []
    await _age(store.db, "k1", 61)
    again = await submit(store.db, queue, StepsTask(), 5, key="k1", resend_after_s=60)
    assert (again.queued, again.resent) == (True, True)
    assert await _queued(store) == ["k1"]
    twice = await submit(store.db, queue, StepsTask(), 5, key="k1", resend_after_s=60)
    assert not twice.queued  # sent again once this period
    assert await _queued(store) == ["k1"]


async def test_a_task_that_ever_started_is_never_sent_again(store: Any) -> None:
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity, key in ((5, "k1"), (6, "k2")):
        assert await tasks.submit("steps", entity, key, "{}")
        await _age(store.db, key, 3600)
    row = await tasks.get("steps", "k1")
    assert row is not None and await tasks.start(row.id, "A", 30.0)
    await tasks.release(row.id, "A")  # given back unattempted (a busy backend): pending
    cutoff = await store.db.clock_ms() - 60_000
    assert await tasks.lost_firsts("steps", [5, 6], cutoff) == {6: "k2"}
    started = await submit(store.db, queue, StepsTask(), 5, key="k1", resend_after_s=60)
    never = await submit(store.db, queue, StepsTask(), 6, key="k2", resend_after_s=60)
    assert (started.queued, never.queued) == (False, True)  # alike but for the start
    assert await _queued(store) == ["k2"]


async def test_a_task_waiting_its_turn_is_not_taken_for_lost(store: Any) -> None:
    """b2, old, waits behind b1: while b1 runs, and for a period after b1 ended (b2's
    own message waits its turn until then), a resubmission of b2 sends nothing."""
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for key in ("b1", "b2"):
        assert await tasks.submit("steps", 5, key, "{}")
        await _age(store.db, key, 3600)
    row = await tasks.get("steps", "b1")
    assert row is not None and await tasks.start(row.id, "A", 30.0)
    behind = await submit(store.db, queue, StepsTask(), 5, key="b2", resend_after_s=60)
    assert not behind.queued  # b1 runs: b2 is not its entity's turn
    assert await tasks.finish(row.id, "A", TaskState.SUCCEEDED, None)
    just = await submit(store.db, queue, StepsTask(), 5, key="b2", resend_after_s=60)
    assert not just.queued  # b1 ended a moment ago: b2's message comes back by itself
    await store.db.execute_sql(
        "UPDATE batchrun_entity_task SET finished_at = finished_at - 61000 WHERE task_key = 'b1'",
        (),
    )
    later = await submit(store.db, queue, StepsTask(), 5, key="b2", resend_after_s=60)
    assert later.queued  # its turn for a period, never started: lost
    assert await _queued(store) == ["b2"]


async def test_a_resend_the_queue_refuses_is_tried_again(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    assert await tasks.submit("steps", 5, "k1", "{}")
    await _age(store.db, "k1", 120)
    with pytest.raises(QueueError):
        await submit(
            store.db, cast(WorkQueue, RefusingQueue()), StepsTask(), 5, key="k1", resend_after_s=60
        )
    sweep = LostTaskSweep(tasks, cast(WorkQueue, RefusingQueue()), after_s=60)
    assert await sweep.behind("steps", [5], present=set()) == 0  # logged, not raised
    assert "looking for lost steps tasks failed: could not send" in caplog.text
    again = await submit(store.db, queue, StepsTask(), 5, key="k1", resend_after_s=60)
    assert again.queued  # the failed sends took their claim back
    assert await _queued(store) == ["k1"]


async def test_what_a_failed_or_dead_task_holds_up(store: Any) -> None:
    """Behind a task that failed and waits for its retry, a task is not lost: it is not
    its turn. Behind one dead a period ago, it is."""
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity, keys in ((5, ("f1", "f2")), (6, ("d1", "d2"))):
        for key in keys:
            assert await tasks.submit("steps", entity, key, "{}")
            await _age(store.db, key, 3600)
    for key, state in (("f1", TaskState.FAILED), ("d1", TaskState.DEAD)):
        row = await tasks.get("steps", key)
        assert row is not None and await tasks.start(row.id, "A", 30.0)
        assert await tasks.finish(row.id, "A", state, "boom")
    await store.db.execute_sql(
        "UPDATE batchrun_entity_task SET finished_at = finished_at - 120000"
        " WHERE task_key IN ('f1', 'd1')",
        (),
    )
    sweep = LostTaskSweep(tasks, queue, after_s=60)
    assert await sweep.behind("steps", [5, 6], present=set()) == 1
    assert await _queued(store) == ["d2"]
    assert sweep.sent == 1  # the consumer adds it to its drain's requeued


async def test_a_task_of_a_job_run_in_parallel_is_lost_whatever_is_before_it(
    store: Any,
) -> None:
    class Parallel(StepsTask):
        name = "steps"
        serial = "none"

    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for key in ("p1", "p2"):
        assert await tasks.submit("steps", 5, key, "{}")
        await _age(store.db, key, 3600)
    row = await tasks.get("steps", "p1")
    assert row is not None and await tasks.start(row.id, "A", 30.0)
    serial = await submit(store.db, queue, StepsTask(), 5, key="p2", resend_after_s=60)
    assert not serial.queued  # one at a time: p2 waits behind p1
    parallel = await submit(store.db, queue, Parallel(), 5, key="p2", resend_after_s=60)
    assert parallel.queued  # nothing to wait for: never started, so lost
    assert await _queued(store) == ["p2"]


async def test_entities_seen_between_two_looks_are_looked_at_by_the_second(
    store: Any,
) -> None:
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity, key in ((5, "a1"), (6, "b1")):
        assert await tasks.submit("steps", entity, key, "{}")
        await _age(store.db, key, 3600)
    sweep = LostTaskSweep(tasks, queue, after_s=60)
    assert await sweep.behind("steps", [7], present=set()) == 0  # looks: nothing there
    assert await sweep.behind("steps", [5], present=set()) == 0  # too soon: 5 noted
    sweep.every_s = 0.0
    assert await sweep.behind("steps", [6], present=set()) == 2  # 5 and 6
    assert sorted(await _queued(store)) == ["a1", "b1"]


async def test_a_look_out_that_fails_leaves_the_batch_alone(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = TaskStore(store.db)
    await store.db.execute_sql("DROP TABLE batchrun_entity_task", ())
    sweep = LostTaskSweep(tasks, LocalQueue(store.db), after_s=60)
    assert await sweep.behind("steps", [5], present=set()) == 0
    assert "looking for lost steps tasks failed" in caplog.text


async def test_a_consumer_sends_what_its_waiting_tasks_wait_behind(store: Any) -> None:
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity, key in ((5, "a1"), (5, "a2"), (6, "b1"), (7, "c1"), (7, "c2")):
        assert await tasks.submit("steps", entity, key, "{}")
    for key in ("a1", "a2", "b1", "c1"):
        await _age(store.db, key, 120)  # c2 is young, but c1 ahead of it is old
    row = await tasks.get("steps", "c1")
    assert row is not None and await tasks.start(row.id, "A", 30.0)  # c1 runs: not lost
    cutoff = await store.db.clock_ms() - 60_000
    assert await tasks.lost_firsts("steps", [5, 6, 7], cutoff) == {5: "a1", 6: "b1"}
    sweep = LostTaskSweep(tasks, queue, after_s=60)
    # a2 waits behind a1; b1's own message is in the batch: only a1 is sent again
    assert await sweep.behind("steps", [5, 6], present={"a2", "b1"}) == 1
    assert await _queued(store) == ["a1"]
    other = LostTaskSweep(tasks, queue, after_s=60)  # another consumer, the same period
    other.every_s = 0.0  # (it looks, and finds a1 sent already)
    assert await other.behind("steps", [5], present={"a2"}) == 0
    assert await _queued(store) == ["a1"]
    assert await sweep.behind("steps", [6], present=set()) == 0  # looked a moment ago
    sweep.every_s = 0.0
    assert await sweep.behind("steps", [6], present=set()) == 1  # b1's message was lost too
    assert await _queued(store) == ["a1", "b1"]


async def test_an_idle_sweep_sends_a_lost_task_nothing_waits_behind(store: Any) -> None:
    """An entity's only task, written with no message (s1), is found by the sweep of an
    empty queue; a young task (s2), a task that waits its turn behind a running one (r2)
    and one that started once (x1) are not; one sweep a period sends it."""
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity, key, age_s in (
        (5, "s1", 3600),
        (6, "s2", 10),
        (7, "r1", 3600),
        (7, "r2", 3600),
        (8, "x1", 3600),
    ):
        assert await tasks.submit("steps", entity, key, "{}")
        await _age(store.db, key, age_s)
    for key, release in (("r1", False), ("x1", True)):
        row = await tasks.get("steps", key)
        assert row is not None and await tasks.start(row.id, "A", 30.0)
        if release:
            await tasks.release(row.id, "A")  # given back unattempted: pending, started once
    assert await sweep_idle(tasks, queue, {"steps": True}, after_s=60) == 1
    assert await _queued(store) == ["s1"]
    assert await sweep_idle(tasks, queue, {"steps": True}, after_s=60) == 0  # swept just now
    sweep._SWEPT.clear()  # another process, the same period: s1 was sent already
    assert await sweep_idle(tasks, queue, {"steps": True}, after_s=60) == 0
    assert await _queued(store) == ["s1"]
    sweep._SWEPT.clear()  # a job run in parallel: r2 waits for nothing, so it is lost
    assert await sweep_idle(tasks, queue, {"steps": False}, after_s=60) == 1
    assert await _queued(store) == ["s1", "r2"]


async def test_an_idle_sweep_reads_a_slice_at_a_time_from_where_it_stopped(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded: a sweep reads SLICE never-started tasks in id order, the next one on from
    where it stopped, then round again: a head of tasks that only wait their turn (w1, w2
    behind the running r) cannot hide a lost task behind it (c) from every sweep."""
    monkeypatch.setattr(sweep, "SLICE", 2)
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity, key in ((5, "r"), (5, "w1"), (5, "w2"), (7, "c"), (8, "d")):
        assert await tasks.submit("steps", entity, key, "{}")
        await _age(store.db, key, 3600)
    row = await tasks.get("steps", "r")
    assert row is not None and await tasks.start(row.id, "A", 30.0)  # w1, w2 wait behind it

    async def swept() -> int:
        sweep._SWEPT.clear()  # as if its period had passed
        return await sweep_idle(tasks, queue, {"steps": True}, after_s=60)

    assert await swept() == 0  # w1, w2: their turn has not come
    assert await swept() == 2  # c, d
    assert await _queued(store) == ["c", "d"]
    assert await swept() == 0  # round again: w1, w2 still wait; c, d sent this period


async def test_an_idle_sweep_stops_between_sends_when_told(store: Any) -> None:
    """A stop (SIGTERM, the Lambda's deadline) ends the sweep between sends: what it
    claimed is sent, the rest is left for the next sweep."""
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    for entity in range(1, 13):
        assert await tasks.submit("steps", entity, f"k{entity}", "{}")
        await _age(store.db, f"k{entity}", 3600)
    stop = StopToken()

    class StopAfterFirstBatch(LocalQueue):
        async def send(self, bodies: Sequence[str], *, delay_s: float = 0.0) -> None:
            await super().send(bodies, delay_s=delay_s)
            stop.request("told to stop")

    first = StopAfterFirstBatch(store.db)
    assert await sweep_idle(tasks, first, {"steps": False}, after_s=60, stop=stop) == 10
    assert len(await _queued(store)) == 10  # one batch of SEND_BATCH, then it stopped
    sweep._SWEPT.clear()
    again = await sweep_idle(tasks, queue, {"steps": False}, after_s=60)
    assert again == 2 and sorted(await _queued(store)) == sorted(f"k{e}" for e in range(1, 13))


async def test_the_runtime_sweeps_only_its_own_queue_when_empty_and_not_paused(
    store: Any,
) -> None:
    """What the runtime adds: the queue asked when the caller holds a batch (the Lambda's
    case: one message more than the batch is a backlog), the queue tasks are submitted to
    only, and no job that is paused (its messages wait hidden, so the queue looks empty)."""
    tasks, queue = TaskStore(store.db), LocalQueue(store.db)
    assert await tasks.submit("steps", 5, "s1", "{}")
    await _age(store.db, "s1", 3600)
    await queue.send(['{"kind": "other"}', '{"kind": "other"}'])
    runtime = Runtime(StepsTask(), store, None, queue, Settings.from_env({}))
    assert await runtime.resend_lost_tasks(queue, in_flight=1) == 0  # a backlog
    sweep._SWEPT.clear()
    other = LocalQueue(store.db)
    other.url = "local://another"
    assert await runtime.resend_lost_tasks(other) == 0  # not where tasks are submitted
    runtime.steering._rows = [Control("steps", "", True, "maintenance", 0, None)]
    assert await runtime.resend_lost_tasks(queue, in_flight=2) == 0  # paused
    runtime.steering._rows = []
    assert await runtime.resend_lost_tasks(queue, in_flight=2) == 1
    assert (await _queued_kinds(store))[-1] == "s1"


async def test_an_idle_sweep_that_fails_is_logged(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await store.db.execute_sql("DROP TABLE batchrun_entity_task", ())
    swept = sweep_idle(TaskStore(store.db), LocalQueue(store.db), {"steps": True}, after_s=60)
    assert await swept == 0
    assert "looking for lost steps tasks failed" in caplog.text


def _written_not_sent(db_url: str, entity: int, key: str, data: str, age_s: float) -> None:
    """What a submitter that died between its two steps leaves: the row, no message."""

    async def write() -> None:
        db = await connect(db_url)
        try:
            assert await TaskStore(db).submit("steps", entity, key, data)
            await _age(db, key, age_s)
        finally:
            await db.close()

    asyncio.run(write())


def test_a_worker_runs_a_lost_task_its_entitys_later_task_waits_behind(sqlite_url: str) -> None:
    """End to end: the row of k1 is written with no message (its submitter died); k2 of
    the same entity is submitted normally and waits behind it; the worker sends k1 again
    once it is older than BATCHRUN_TASK_RESEND_S, then runs both, in submission order."""
    env = {**migrate_task_jobs(sqlite_url), "BATCHRUN_TASK_RESEND_S": "1"}
    _written_not_sent(sqlite_url, 3, "k1", '{"seq": 1}', age_s=0)
    submitted = run_cli(
        "submit", "steps", "--id", "3", "--key", "k2", "--data", '{"seq": 2}', env=env
    )
    assert submitted.returncode == 0, submitted.stderr
    served = run_cli("worker", "--idle-exit", "4", "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    # k1 by k2's consumer, or by the sweep of an empty queue when that comes first: once.
    # k2's own message waits its turn hidden, which can outlast the 1 s allowed here; the
    # sweep then sends k2 a twin (by design), which finds it done: each counts in requeued.
    said = served.stderr
    assert said.count("task 'k1' of job 'steps' was submitted but never started") == 1, said
    assert json.loads(served.stdout)["requeued"] == said.count("its message is sent again")
    assert [r[1] for r in effects(sqlite_url)] == ["k1", "k2"]


@pytest.mark.parametrize("command", ["worker", "retry"])
def test_a_lost_task_nothing_waits_behind_is_run_by_the_next_consumer(
    sqlite_url: str, command: str
) -> None:
    """End to end: k5, its entity's only task, written with no message (its submitter
    died): no message of the entity waits behind it and nobody submits it again. A
    ``worker`` that finds the queue empty, or a ``retry`` drain at its end, sends it
    again and runs it; the summary counts it in ``requeued``."""
    env = {**migrate_task_jobs(sqlite_url), "BATCHRUN_TASK_RESEND_S": "1"}
    _written_not_sent(sqlite_url, 5, "k5", '{"seq": 1}', age_s=5)
    # --idle-exit 0: a worker that sent something works it before it may call itself idle
    args = ["worker", "--idle-exit", "0"] if command == "worker" else ["retry"]
    served = run_cli(*args, "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    assert [r[1] for r in effects(sqlite_url)] == ["k5"]
    summary = json.loads(served.stdout)
    assert (summary["requeued"], summary["succeeded"]) == (1, 1), summary
    assert "never started, and the queue is empty: its message is sent again" in served.stderr


def _on_sqs(moto_server: MotoServer, url: str, db_url: str) -> dict[str, str]:
    """The task jobs migrated on ``db_url``, consumed from the SQS queue ``url``; a task
    looks lost one second after its submission."""
    return {
        **migrate_task_jobs(db_url),
        **moto_server.env,
        "BATCHRUN_RETRY_QUEUE": url,
        "BATCHRUN_TASK_RESEND_S": "1",
    }


def test_the_sqs_triggered_lambda_sends_a_lost_task_once_the_queue_holds_only_its_batch(
    moto_server: MotoServer, mysql_url: str
) -> None:
    """k7, its entity's only task, has no message; another entity's task is submitted as
    usual. The Lambda invocation that works it finds the queue holding nothing but its
    batch, sends k7 again, and the next invocation runs it."""
    moto_server.reset()
    url, _ = make_queue_with_dlq(moto_server, visibility_s=30)
    env = _on_sqs(moto_server, url, mysql_url)
    _written_not_sent(mysql_url, 9, "k7", '{"seq": 1}', age_s=5)
    with batchrun.connect(db=mysql_url, queue=url, jobs=JOBS, env=moto_server.env) as client:
        client.submit("steps", 10, data={"seq": 1}, key="k8")
    drain_as_sqs_events(aws_client(moto_server), url, env, seconds=60)
    assert sorted(r[1] for r in effects(mysql_url)) == ["k7", "k8"]


def test_a_scheduled_lambda_invocation_sends_a_lost_task_on_an_empty_queue(
    moto_server: MotoServer, mysql_url: str
) -> None:
    """Where only SQS triggers the Lambda, a lost task that nothing waits behind would wait
    for a message that may never come; the scheduled invocation sweeps after its runs.
    Without it the queue stays empty and k7 never runs."""
    moto_server.reset()
    url, _ = make_queue_with_dlq(moto_server, visibility_s=30)
    env = _on_sqs(moto_server, url, mysql_url)
    _written_not_sent(mysql_url, 9, "k7", '{"seq": 1}', age_s=5)
    event = {
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "time": "2025-06-01T06:00:00Z",
    }
    result = aws_lambda.handle(event, FakeContext(60), environ=env)
    assert (result["job"], result["period"]) == ("birthday", "2025-06"), result
    drain_as_sqs_events(aws_client(moto_server), url, env, seconds=60)
    assert [r[1] for r in effects(mysql_url)] == ["k7"]


def test_the_cli_resubmission_of_a_lost_task_says_it_was_sent_again(sqlite_url: str) -> None:
    env = {**migrate_task_jobs(sqlite_url), "BATCHRUN_TASK_RESEND_S": "60"}
    _written_not_sent(sqlite_url, 4, "k9", "{}", age_s=120)
    again = run_cli("submit", "steps", "--id", "4", "--key", "k9", "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"job": "steps", "entity_id": 4, "key": "k9", "queued": True}
    said = run_cli("submit", "steps", "--id", "4", "--key", "k9", env=env)
    assert said.returncode == 0 and "nothing queued" in said.stderr, said.stderr  # once a period
    assert query(sqlite_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 1
    assert run_cli("worker", "--idle-exit", "2", env=env, timeout=120).returncode == 0
    assert [r[1] for r in effects(sqlite_url)] == ["k9"]


def test_on_sqs_fifo_a_lost_task_is_sent_outside_the_group_it_waits_in(
    moto_server: MotoServer, mysql_url: str
) -> None:
    """On a FIFO queue the waiting k2, hidden while it waits, holds its entity's message
    group: k1 sent again into that group would come only after k2, which waits for k1
    (for ever on a queue with no dead-letter queue: no copy of k2 ever goes to the end).
    The resend goes out in a group of its own; the database keeps the order."""
    moto_server.reset()
    fifo = {"FifoQueue": "true"}
    url = aws_client(moto_server).create_queue(QueueName="tasks.fifo", Attributes=fifo)["QueueUrl"]
    env = _on_sqs(moto_server, url, mysql_url)
    _written_not_sent(mysql_url, 3, "k1", '{"seq": 1}', age_s=0)
    with batchrun.connect(db=mysql_url, queue=url, jobs=JOBS, env=moto_server.env) as client:
        client.submit("steps", 3, data={"seq": 2}, key="k2")
    served = run_cli("worker", "--idle-exit", "4", "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    assert [r[1] for r in effects(mysql_url)] == ["k1", "k2"]
    # by k2's consumer, or by the sweep of an empty queue when that comes first
    assert "its message is sent again" in served.stderr

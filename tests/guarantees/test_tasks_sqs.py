"""Tasks on SQS FIFO (moto): 4 workers, every task once, one user's never overlapping and
in submission order (each user its own MessageGroupId)."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

import pytest
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.db import query
from support.lambda_context import drain_as_sqs_events
from support.tasks import JOBS, effects, migrate_task_jobs, start_workers

import batchrun
from batchrun.errors import QueueError


def test_four_workers_on_sqs_fifo(moto_server: MotoServer, mysql_url: str) -> None:
    moto_server.reset()
    url, _ = make_queue_with_dlq(moto_server, "tasks", dlq_name="tasks-dlq", fifo=True)
    env = {**migrate_task_jobs(mysql_url), **moto_server.env, "BATCHRUN_RETRY_QUEUE": url}
    submitted: dict[int, list[str]] = defaultdict(list)
    with batchrun.connect(db=mysql_url, queue=url, jobs=JOBS, env=moto_server.env) as client:
        for seq in range(3):
            for uid in range(1, 51):
                submitted[uid].append(client.submit("steps", uid, data={"seq": seq}))
    for worker in start_workers(env, 4):
        _, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-2000:]
    rows = effects(mysql_url)
    assert len(rows) == 150 and len({r[1] for r in rows}) == 150  # each task once
    done = query(mysql_url, "SELECT COUNT(*) FROM batchrun_entity_task WHERE state = 2")
    assert done[0][0] == 150
    per_user: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        per_user[int(row[0])].append(row)
    for uid, runs in per_user.items():
        runs.sort(key=lambda r: r[3])
        assert all(b[3] >= a[4] for a, b in pairwise(runs)), f"user {uid}: tasks overlapped"
        assert [r[1] for r in runs] == submitted[uid], f"user {uid} out of submission order"


def test_the_sqs_triggered_lambda_serves_tasks(moto_server: MotoServer, mysql_url: str) -> None:
    moto_server.reset()
    url, _ = make_queue_with_dlq(moto_server, visibility_s=30)
    env = {
        **migrate_task_jobs(mysql_url),
        **moto_server.env,
        "BATCHRUN_RETRY_QUEUE": url,
        "BATCHRUN_LEASE_S": "5",
    }
    submitted: dict[int, list[str]] = defaultdict(list)
    with batchrun.connect(db=mysql_url, queue=url, jobs=JOBS, env=moto_server.env) as client:
        for seq in range(3):
            for uid in range(1, 21):
                submitted[uid].append(client.submit("steps", uid, data={"seq": seq}))
    drain_as_sqs_events(aws_client(moto_server), url, env, seconds=60)
    rows = effects(mysql_url)
    assert len(rows) == 60 and len({r[1] for r in rows}) == 60  # each task once
    for uid in submitted:
        runs = sorted((r for r in rows if r[0] == uid), key=lambda r: r[3])
        assert [r[1] for r in runs] == submitted[uid]  # in order, even on a standard queue
        assert all(b[3] >= a[4] for a, b in pairwise(runs))


def test_a_submit_whose_message_was_not_sent_is_taken_back(mysql_url: str) -> None:
    """The queue down at a submit: the caller gets the QueueError and the row is taken
    back, so the same key submitted again is queued and runs, and the entity's next task is
    not held up behind a row that has no message."""
    server = MotoServer().start()
    server.reset()  # moto's state lives in this process: earlier tests' queues would clash
    try:
        url, _ = make_queue_with_dlq(server, visibility_s=30)
        env = {**migrate_task_jobs(mysql_url), **server.env, "BATCHRUN_RETRY_QUEUE": url}
        with batchrun.connect(db=mysql_url, queue=url, jobs=JOBS, env=server.env) as client:
            assert client.submit_task("steps", 7, data={"seq": 0}, key="first").queued
            server.stop()
            with pytest.raises(QueueError):
                client.submit("steps", 7, data={"seq": 1}, key="second")
            keys = query(mysql_url, "SELECT task_key FROM batchrun_entity_task ORDER BY id")
            assert keys == [("first",)], "the unsent submission is taken back"
            server.start()  # the queue is back, with its first message (moto kept it)
            assert client.submit_task("steps", 7, data={"seq": 1}, key="second").queued
            assert client.submit_task("steps", 7, data={"seq": 2}, key="third").queued
        for worker in start_workers(env, 1):
            _, err = worker.communicate(timeout=300)
            assert worker.returncode == 0, err[-2000:]
        runs = sorted(effects(mysql_url), key=lambda r: r[3])
        assert [r[1] for r in runs] == ["first", "second", "third"]  # each once, in order
    finally:
        server.stop()

"""A retry's delay means the same on every path: ``Retry(delay_s)`` raised in a period run
holds the entity's retry message back that long, on the local queue (its stored
``visible_at``) and on SQS (``DelaySeconds``); ``retry`` honours it too when it fails
again, and a busy backend's ``Retry-After`` holds a message given back at least as long.

No test sleeps the delay: the local queue's stored ``visible_at`` is moved back by the
time a test pretends has passed, and the SQS test uses a 3 s delay against 1 s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.http_server import GrantsTestServer

import batchrun
from batchrun.db import Store, connect
from batchrun.db.store import State
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.pipeline.run import Options
from batchrun.queue.base import WorkQueue
from batchrun.queue.base import from_url as queue_from_url
from batchrun.queue.sqs import MAX_DELAY_S, delay_seconds
from batchrun.registry import discover
from batchrun.runtime import Runtime
from batchrun.settings import Settings

N = 3


def june() -> batchrun.Period:
    from batchrun.period import parse

    return parse("month", "2025-06")


class Later(batchrun.Job):
    """Asks for a 30 s delay on each entity's first attempt, then succeeds."""

    name = "later"
    period = "month"

    def __init__(self, delay_s: float = 30.0) -> None:
        self.delay_s = delay_s
        self.tries: Counter[int] = Counter()

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        return [{"id": i} for i in range(after + 1, min(after + limit, N) + 1)]

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        self.tries[row["id"]] += 1
        if self.tries[row["id"]] == 1:
            raise batchrun.Retry("come back later", delay_s=self.delay_s)


def credits_job() -> batchrun.Job:
    return discover([str(ROOT / "examples/credits/credits.py")]).get_job("credits")


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A migrated, empty store with the credits example's tables too (one migrate, as
    ``batchrun --jobs examples/credits/credits.py db migrate`` does)."""
    database = await connect(db_url, create=True)
    migrated = Store(database)
    await migrated.migrate([Birthday(), credits_job()])
    try:
        yield migrated
    finally:
        await database.close()


@pytest.fixture
async def make_runtime(
    store: Store, make_settings: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Runtime]]:
    """Factory: ``make_runtime(job, queue=None, **settings)`` on the migrated ``store``."""
    mailers: list[Any] = []

    def make(job: batchrun.Job, queue: WorkQueue | None = None, **overrides: Any) -> Runtime:
        settings = make_settings(store.db.url, **overrides)
        mailer = mailer_from_url(settings.mail_url, timeout=2.0)
        mailers.append(mailer)
        if queue is None:
            queue = queue_from_url(None, db=store.db, max_receives=5)
        return Runtime(job, store, mailer, queue, settings)

    yield make
    for mailer in mailers:
        await mailer.close()


async def held_back_ms(store: Store) -> list[int]:
    rows = await store.jobdb.fetch(
        "SELECT visible_at - created_at AS held FROM batchrun_queue WHERE dead = 0 ORDER BY id"
    )
    return [int(r["held"]) for r in rows]


async def time_passes(store: Store, seconds: float) -> None:
    """As if ``seconds`` had passed for the local queue: its stored times move back."""
    ms = int(seconds * 1000)
    await store.jobdb.execute(
        "UPDATE batchrun_queue SET visible_at = visible_at - :ms, created_at = created_at - :ms",
        ms=ms,
    )


# -- Retry(delay_s) on the local queue -----------------------------------------------------


async def test_a_retry_delay_from_a_run_holds_the_local_queue_message_back(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    job = Later(30.0)
    rt = make_runtime(job)
    summary = await rt.run(june(), Options(concurrency=2), job="later")
    assert (summary.queued_for_retry, summary.succeeded, summary.exit_code) == (N, 0, 3)
    assert await held_back_ms(store) == [30_000] * N

    await time_passes(store, 1.0)  # a retry started 1 s later finds nothing to do yet
    early = await rt.retry(Options(concurrency=2))
    assert (early.processed, early.succeeded, early.remaining) == (0, 0, N)
    assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 1))

    await time_passes(store, 29.0)  # 30 s after the run: each is worked, once
    late = await rt.retry(Options(concurrency=2))
    assert (late.processed, late.succeeded, late.remaining) == (N, N, 0)
    assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 2))


async def test_a_worker_honours_the_delay_too(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    job = Later(30.0)
    rt = make_runtime(job)
    await rt.run(june(), job="later")
    assert rt.queue is not None
    await time_passes(store, 1.0)
    early = await rt.serve(rt.queue, idle_exit_s=0.5)  # `batchrun worker`, idle for 0.5 s
    assert (early.processed, early.remaining) == (0, N)
    await time_passes(store, 29.0)
    late = await rt.serve(rt.queue, idle_exit_s=0.5)
    assert (late.processed, late.succeeded, late.remaining) == (N, N, 0)
    assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 2))


async def test_a_run_failure_without_a_delay_is_retried_at_once(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    class Flaky(Later):
        name = "flaky"

        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            self.tries[row["id"]] += 1
            if self.tries[row["id"]] == 1:
                raise batchrun.Retry("flaky")

    job = Flaky()
    rt = make_runtime(job)
    assert (await rt.run(june(), job="flaky")).queued_for_retry == N
    assert await held_back_ms(store) == [0] * N
    assert (await rt.retry()).succeeded == N


async def test_a_retry_that_asks_again_is_held_back_by_its_own_delay(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    class Twice(Later):
        name = "twice"

        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            self.tries[row["id"]] += 1
            if self.tries[row["id"]] <= 2:
                raise batchrun.Retry("later again", delay_s=20.0 * self.tries[row["id"]])

    job = Twice()
    rt = make_runtime(job)
    await rt.run(june(), job="twice")
    await time_passes(store, 20.0)
    second = await rt.retry()
    assert (second.processed, second.failed, second.remaining) == (N, N, N)
    rows = await store.jobdb.fetch("SELECT visible_at FROM batchrun_queue WHERE dead = 0")
    now = await store.jobdb.fetch("SELECT MAX(created_at) AS at FROM batchrun_queue")
    # the consumer hid each for the 40 s the second attempt asked for (from about now)
    assert all(int(r["visible_at"]) - int(now[0]["at"]) >= 39_000 for r in rows), rows
    await time_passes(store, 39.0)  # just short of it
    assert (await rt.retry()).processed == 0
    await time_passes(store, 2.0)
    assert (await rt.retry()).succeeded == N


async def test_the_policy_caps_every_delay(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    class Capped(Later):
        name = "capped"
        retry = batchrun.RetryPolicy(max_delay_s=5.0)

    rt = make_runtime(Capped(3600.0))
    await rt.run(june(), job="capped")
    assert await held_back_ms(store) == [5_000] * N


# -- HTTP 429 Retry-After in the credits example -------------------------------------------


async def test_a_429_retry_after_through_a_backend_holds_the_given_back_message(
    store: Store, make_runtime: Callable[..., Runtime], grants: GrantsTestServer
) -> None:
    # A 429 through the credits backend is busy, not a failure: a consumer that may not
    # wait (BATCHRUN_BUSY_WAIT_S=0) gives each entity back, held at least its Retry-After.
    grants.reset()
    job = credits_job()
    await store.jobdb.execute(
        "INSERT INTO customer (email, plan, active) VALUES :rows",
        rows=[(f"c{i}@example.com", "starter", 1) for i in range(1, N + 1)],
    )
    environ = {"BATCHRUN_BACKEND_CREDITS_URL": grants.url}

    def runtime() -> Runtime:  # a new process: the backend's in-process pause is not there
        return make_runtime(job, environ=environ, busy_wait_s=0.0)

    await runtime().submit(job, june(), list(range(1, N + 1)))
    grants.answer_next(1, 429, retry_after=30)  # the rest are held back by its pause
    early = await runtime().retry()
    assert (early.processed, early.busy, early.failed, early.remaining) == (0, N, 0, N)
    figures = early.to_json()["backends"]["credits"]
    assert (figures["calls"], figures["throttles"], figures["busy_waits"]) == (1, 1, N)
    assert all(held >= 30_000 for held in await held_back_ms(store))
    attempts = await store.jobdb.fetch("SELECT attempts FROM batchrun_ledger")
    assert [r["attempts"] for r in attempts] == [0] * N  # busy is no attempt

    await time_passes(store, 1.0)
    assert (await runtime().retry()).processed == 0  # not called again yet
    calls = len(grants.calls())

    await time_passes(store, 30.0)
    late = await runtime().retry()
    assert (late.processed, late.succeeded, late.remaining) == (N, N, 0)
    assert len(grants.calls()) == calls + N
    assert sorted(grants.grants_per_key().values()) == [1] * N


# -- SQS: DelaySeconds ---------------------------------------------------------------------


def test_sqs_delays_are_whole_seconds_up_to_fifteen_minutes() -> None:
    assert [delay_seconds(s) for s in (0, 0.2, 30, 899.5, 900, 901, 86_400)] == [
        0,
        1,
        30,
        900,
        900,
        MAX_DELAY_S,
        MAX_DELAY_S,
    ]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_retry_delay_from_a_run_holds_the_sqs_message_back(
    store: Store,
    make_runtime: Callable[..., Runtime],
    moto_server: MotoServer,
) -> None:
    moto_server.reset()
    env = moto_server.env
    import aioboto3

    session = aioboto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )
    async with session.client("sqs", endpoint_url=env["AWS_ENDPOINT_URL"]) as client:
        url = (await client.create_queue(QueueName="delays"))["QueueUrl"]
    queue = queue_from_url(url, db=store.db, max_receives=5, env=env)
    job = Later(3.0)  # 3 s against a retry 1 s later: the ratio of 30 s against 1 s, smaller
    rt = make_runtime(job, queue=queue, retry_queue_url=url)
    try:
        loop = asyncio.get_running_loop()
        summary = await rt.run(june(), job="later")
        started = loop.time()  # the messages were sent by now
        assert summary.queued_for_retry == N
        await asyncio.sleep(max(0.0, 1.0 - (loop.time() - started)))
        early = await rt.retry()
        assert early.processed == 0
        assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 1))
        await asyncio.sleep(max(0.0, 4.0 - (loop.time() - started)))
        late = await rt.retry()
        assert (late.processed, late.succeeded) == (N, N)
        assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 2))
    finally:
        await queue.close()


# -- a job's own attempts --------------------------------------------------------------------


async def test_a_jobs_attempts_decide_when_a_retry_gives_up(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    class Never(Later):
        name = "never"
        retry = batchrun.RetryPolicy(attempts=2)  # the deployment's default allows 6

        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            self.tries[row["id"]] += 1
            raise batchrun.Retry("still down")

    job = Never()
    rt = make_runtime(job)
    assert (await rt.run(june(), job="never")).queued_for_retry == N
    drained = await rt.retry()
    assert (drained.processed, drained.dead_lettered, drained.remaining) == (N, N, 0)
    assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 2))
    reasons = await store.jobdb.fetch("SELECT last_error FROM batchrun_ledger WHERE job = 'never'")
    # each tried twice (job.tries): it said "gave up after 1 attempts"
    assert {r["last_error"] for r in reasons} == {"gave up after 2 attempts: still down"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_jobs_attempts_past_the_sqs_redrive_limit_decide_alone(
    store: Store, make_runtime: Callable[..., Runtime], moto_server: MotoServer
) -> None:
    """Five attempts on a queue whose redrive policy dead-letters at the third receive:
    SQS moved each retry to the dead-letter queue after three tries, its ledger row still
    'retrying'. Every failed retry is kept (a fresh copy near the limit), so the job's
    policy decides, and the dead letter says why."""
    moto_server.reset()
    url, dlq = make_queue_with_dlq(moto_server, "attempts", dlq_name="attempts-dlq", max_receives=2)

    class Stubborn(Later):
        name = "stubborn"
        retry = batchrun.RetryPolicy(attempts=5, backoff=0.0)

        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            self.tries[row["id"]] += 1
            raise batchrun.Retry("still down")

    job = Stubborn()
    queue = queue_from_url(url, db=store.db, max_receives=2, env=moto_server.env)
    rt = make_runtime(job, queue=queue, retry_queue_url=url)
    try:
        assert (await rt.run(june(), job="stubborn")).queued_for_retry == N
        for _ in range(12):
            if sum(job.tries.values()) >= 5 * N:
                break
            await rt.retry()
            await asyncio.sleep(0.2)
        assert job.tries == Counter(dict.fromkeys(range(1, N + 1), 5))
        rows = await store.jobdb.fetch(
            "SELECT state, last_error FROM batchrun_ledger WHERE job = 'stubborn'"
        )
        assert {(r["state"], r["last_error"]) for r in rows} == {
            (int(State.FAILED), "gave up after 5 attempts: still down")
        }
        letters = aws_client(moto_server).receive_message(
            QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        )["Messages"]
        assert len(letters) == N
        assert {m["MessageAttributes"]["reason"]["StringValue"] for m in letters} == {
            "gave up after 5 attempts: still down"
        }
    finally:
        await queue.close()


async def test_one_attempt_dead_letters_a_runs_failure_at_once(
    store: Store, make_runtime: Callable[..., Runtime]
) -> None:
    class Once(Later):
        name = "once"
        retry = batchrun.RetryPolicy(attempts=1)

    rt = make_runtime(Once())
    summary = await rt.run(june(), job="once")
    assert (summary.queued_for_retry, summary.dead_lettered, summary.exit_code) == (0, N, 0)


# -- the Lambda's SQS consumer -------------------------------------------------------------

LATER_JOB = """
import batchrun

class Later(batchrun.Job):
    name = "later"
    period = "month"

    async def page(self, ctx, after, limit):
        return [{"id": i} for i in range(after + 1, min(after + limit, 3) + 1)]

    async def process(self, ctx, row):
        raise batchrun.Retry("come back later", delay_s=3)
"""


class LambdaContext:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.aws_request_id = "req-delay"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def test_the_lambdas_sqs_consumer_hides_a_retry_for_its_delay(
    moto_server: MotoServer, sqlite_url: str, tmp_path: Path
) -> None:
    import boto3

    from batchrun import aws_lambda
    from batchrun.queue.base import QueueMessage

    moto_server.reset()
    job_file = tmp_path / "later.py"
    job_file.write_text(LATER_JOB)

    async def migrate() -> None:
        database = await connect(sqlite_url, create=True)
        try:
            await Store(database).migrate([Birthday()])
        finally:
            await database.close()

    asyncio.run(migrate())
    env = moto_server.env
    sqs = boto3.client(
        "sqs",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    url = sqs.create_queue(QueueName="lambda-delays")["QueueUrl"]
    body = QueueMessage("retry", "later", "2025-06", entity_id=2, attempt=1).to_json()
    sqs.send_message(QueueUrl=url, MessageBody=body)
    (message,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"]
    environ = {
        **env,
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_RETRY_QUEUE": url,
        "BATCHRUN_JOBS": str(job_file),
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
    }
    event = {
        "Records": [
            {
                "messageId": message["MessageId"],
                "receiptHandle": message["ReceiptHandle"],
                "body": message["Body"],
                "attributes": {"ApproximateReceiveCount": "1"},
                "eventSource": "aws:sqs",
            }
        ]
    }
    result = aws_lambda.handle(event, LambdaContext(60), environ=environ)
    handled = time.monotonic()
    assert result["batchItemFailures"] == [{"itemIdentifier": message["MessageId"]}]
    time.sleep(max(0.0, 1.5 - (time.monotonic() - handled)))  # past our own 1 s visibility
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    time.sleep(max(0.0, 3.5 - (time.monotonic() - handled)))
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", [])
    assert [m["Body"] for m in again] == [body]

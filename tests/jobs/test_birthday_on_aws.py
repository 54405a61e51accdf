"""The birthday job on MariaDB with SES mail and an SQS retry queue (moto's server, aioboto3)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from email.utils import parseaddr
from typing import Any

import aioboto3
import pytest
from support.aws_server import REGION, MotoServer, answer_with, moto_raw_messages
from support.birthday import card_counts, eligible_ids, seed_users, status_of
from support.checks import assert_one_card_each
from support.db import query
from support.periods import month
from support.smtp_server import SmtpTestServer

from batchrun.db import Store, connect
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import Mailer, Message, valid_address
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.period import Unit
from batchrun.queue.base import QueueMessage
from batchrun.queue.base import from_url as queue_from_url
from batchrun.runtime import Options, Runtime
from batchrun.settings import Settings

UNITS: dict[str, Unit] = {"birthday": "month"}  # jobs a consumer parses bodies for

JUNE = month(2025, 6)
SENDER = "birthday@example.com"


async def make_queues(env: dict[str, str], *, fifo: bool = False, max_receives: int = 5) -> str:
    """A retry queue with a dead-letter queue behind it; returns the retry queue's URL."""
    suffix = ".fifo" if fifo else ""
    attributes = {"FifoQueue": "true"} if fifo else {}
    session = aioboto3.Session()
    async with session.client(
        "sqs",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as sqs:
        dlq = (await sqs.create_queue(QueueName=f"dlq{suffix}", Attributes=attributes))["QueueUrl"]
        arn = (await sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]["QueueArn"]
        policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receives)})
        url = await sqs.create_queue(
            QueueName=f"retry{suffix}", Attributes={**attributes, "RedrivePolicy": policy}
        )
        return str(url["QueueUrl"])


@pytest.fixture
async def aws(moto_server: MotoServer) -> dict[str, str]:
    """A clean moto with the sender verified in SES."""
    moto_server.reset()
    env = moto_server.env
    session = aioboto3.Session()
    async with session.client(
        "sesv2",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as ses:
        await ses.create_email_identity(EmailIdentity=SENDER)
    return env


@pytest.fixture
async def make_aws_job(mysql_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Factory: a Runtime on its own pool, with the given mail and queue URLs."""
    opened: list[Any] = []

    async def make(
        env: dict[str, str], *, mail_url: str, queue_url: str, **overrides: Any
    ) -> Runtime:
        settings = Settings(
            db_url=mysql_url,
            mail_url=mail_url,
            retry_queue_url=queue_url,
            sender=SENDER,
            lease_s=2.0,
            retry_base_s=0.0,
            mail_timeout_s=5.0,
            extra=env,
        ).with_overrides(**overrides)
        database = await connect(mysql_url, pool_size=4)
        mailer = mailer_from_url(mail_url, timeout=settings.mail_timeout_s, pool_size=20, env=env)
        queue = queue_from_url(
            queue_url, db=database, max_receives=settings.max_receives, env=env, concurrency=20
        )
        await queue.open()
        opened.append((database, mailer, queue))
        return Runtime(Birthday(), Store(database), mailer, queue, settings)

    yield make
    for database, mailer, queue in opened:
        await mailer.close()
        await queue.close()
        await database.close()


async def seeded(db_url: str, users: int, seed: int) -> set[int]:
    database = await connect(db_url, create=True)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        await seed_users(store, users, seed=seed)
    finally:
        await database.close()
    emails = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = 6"))
    return {uid for uid in eligible_ids(db_url, 6) if valid_address(emails[uid])}


def ses_per_user(server: MotoServer, db_url: str) -> Counter[int]:
    """Messages moto's SES holds, by user id (from the recipient address)."""
    by_email = {e: uid for uid, e in query(db_url, "SELECT id, email FROM user")}
    counts: Counter[int] = Counter()
    for message in moto_raw_messages(server):
        # moto lists the envelope recipient and the To header: one address, twice
        for address in {parseaddr(a)[1] for a in message["destinations"]}:
            counts[by_email[address]] += 1
    return counts


async def test_throttled_and_failing_ses_ends_with_one_card_and_one_message_each(
    mysql_url: str,
    aws: dict[str, str],
    moto_server: MotoServer,
    make_aws_job: Callable[..., Any],
) -> None:
    want = await seeded(mysql_url, 1500, seed=41)
    queue_url = await make_queues(aws)
    job: Runtime = await make_aws_job(aws, mail_url="ses://us-east-1", queue_url=queue_url)
    await job.mailer.open()  # type: ignore[union-attr]
    rng = random.Random(41)
    throttle = answer_with(
        400, "TooManyRequestsException", {"message": "Maximum sending rate exceeded."}
    )
    failing = answer_with(400, "InternalFailureTemporary", {"message": "try again later"})
    fates: Counter[str] = Counter()

    def inject(request: Any, **kwargs: Any) -> Any:
        roll = rng.random()
        if roll < 0.10:
            fates["throttled"] += 1
            return throttle(request, **kwargs)
        if roll < 0.15:
            fates["failed"] += 1
            return failing(request, **kwargs)
        return None

    job.mailer.client.meta.events.register("before-send.sesv2.SendEmail", inject)  # type: ignore[union-attr]
    summary = await job.run(JUNE, Options(concurrency=10))
    assert fates["throttled"] > 0 and fates["failed"] > 0
    assert summary.throttles == fates["throttled"]
    assert summary.failed == summary.queued_for_retry > 0
    assert summary.exit_code == 3
    status = await status_of(job, month(2025, 6))
    assert all("throttl" not in str(p[3]).lower() for p in status.problems), (
        "throttling must never count as the user failing"
    )

    result = await job.retry(Options(concurrency=10))
    assert result.remaining == 0 and result.succeeded >= summary.queued_for_retry
    status = await status_of(job, month(2025, 6))
    assert status.pending == 0 and status.emails_sent == len(want)
    assert_one_card_each(mysql_url, want)
    assert ses_per_user(moto_server, mysql_url) == Counter(dict.fromkeys(want, 1))


async def test_a_user_always_failing_reaches_the_dead_letter_queue(
    mysql_url: str,
    aws: dict[str, str],
    make_aws_job: Callable[..., Any],
) -> None:
    want = await seeded(mysql_url, 600, seed=42)
    victim = min(want)
    (email,) = query(mysql_url, "SELECT email FROM user WHERE id = %s", victim)[0]
    queue_url = await make_queues(aws, max_receives=3)
    job: Runtime = await make_aws_job(aws, mail_url="ses://us-east-1", queue_url=queue_url)
    await job.mailer.open()  # type: ignore[union-attr]
    failing = answer_with(400, "InternalFailureTemporary", {"message": "try again later"})

    def inject(request: Any, **kwargs: Any) -> Any:
        return failing(request, **kwargs) if email.encode() in request.body else None

    job.mailer.client.meta.events.register("before-send.sesv2.SendEmail", inject)  # type: ignore[union-attr]
    summary = await job.run(JUNE, Options(concurrency=5))
    assert summary.queued_for_retry == 1
    assert job.queue.max_receives == 3  # type: ignore[union-attr]  # from the redrive policy
    result = await job.retry()
    assert (result.processed, result.dead_lettered, result.remaining) == (3, 1, 0)
    status = await status_of(job, month(2025, 6))
    assert status.failed_permanent == 1 and status.pending == 0
    (problem,) = [p for p in status.problems if p[0] == victim]
    assert "gave up after 4 attempts" in str(problem[3])  # the run's, the drain's 3
    assert await job.queue.depths() == (0, 1)  # type: ignore[union-attr]


class Watching:
    """Wraps a real mailer and records how many sends to each recipient overlap."""

    def __init__(self, inner: Mailer) -> None:
        self.inner = inner
        self.in_flight: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()

    async def send(self, message: Message) -> None:
        self.in_flight[message.to_addr] += 1
        self.most[message.to_addr] = max(
            self.most[message.to_addr], self.in_flight[message.to_addr]
        )
        try:
            await asyncio.sleep(0.3)  # long enough for a second consumer to overlap
            await self.inner.send(message)
            self.sent[message.to_addr] += 1
        finally:
            self.in_flight[message.to_addr] -= 1

    async def close(self) -> None:
        await self.inner.close()


async def test_fifo_never_processes_two_failures_of_one_user_at_once(
    mysql_url: str,
    aws: dict[str, str],
    smtp_server: SmtpTestServer,
    make_aws_job: Callable[..., Any],
) -> None:
    want = await seeded(mysql_url, 600, seed=43)
    user = min(want)
    (email,) = query(mysql_url, "SELECT email FROM user WHERE id = %s", user)[0]
    queue_url = await make_queues(aws, fifo=True)
    first: Runtime = await make_aws_job(aws, mail_url=smtp_server.url, queue_url=queue_url)
    second: Runtime = await make_aws_job(aws, mail_url=smtp_server.url, queue_url=queue_url)
    watch = Watching(first.mailer)  # type: ignore[arg-type]
    first.mailer = second.mailer = watch
    bodies = [
        QueueMessage(
            "retry", "birthday", "2025-06", entity_id=user, attempt=n, reason="451"
        ).to_json()
        for n in (1, 2)
    ]
    await first.queue.send(bodies)  # type: ignore[union-attr]
    assert (await first.queue.depths())[0] == 2  # type: ignore[union-attr]

    results = await asyncio.gather(first.retry(), second.retry())
    assert watch.most[email] == 1, "two failures of one user overlapped"
    assert watch.sent[email] == 1
    # Counted in entities: the second message named a user already done, deleted unworked.
    assert sum(r.processed for r in results) == 1
    assert (await first.queue.depths())[0] == 0  # type: ignore[union-attr]
    assert card_counts(mysql_url, 2025) == {user: 1}


async def test_sqs_down_mid_run_loses_no_failure(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    make_aws_job: Callable[..., Any],
) -> None:
    server = MotoServer().start()
    server.reset()  # moto's state lives in this process: earlier tests' queues would clash
    try:
        env = server.env
        want = await seeded(mysql_url, 1500, seed=44)
        emails = dict(query(mysql_url, "SELECT email, id FROM user WHERE birth_month = 6"))
        failing = {e for e, uid in emails.items() if uid in want and uid % 7 == 0}
        smtp_server.set_policy(lambda rcpt, _n: "451 4.3.0 later" if rcpt in failing else None)
        queue_url = await make_queues(env)
        job: Runtime = await make_aws_job(env, mail_url=smtp_server.url, queue_url=queue_url)
        await job.preflight()  # the run starts with the queue there ...
        await asyncio.to_thread(server.stop)  # ... and it is gone after
        summary = await job.run(JUNE, Options(concurrency=10))
        assert summary.not_queued == len(failing) and summary.queued_for_retry == 0
        assert summary.exit_code == 3
        status = await status_of(job, month(2025, 6))
        assert status.retrying == len(failing), "the failures stay in the ledger"

        server.start()  # the queue is back (moto keeps its state in this process)
        smtp_server.set_policy(None)
        result = await job.retry(Options(concurrency=10))
        assert result.requeued == len(failing)
        assert result.succeeded == len(failing) and result.remaining == 0
        status = await status_of(job, month(2025, 6))
        assert status.pending == 0 and status.emails_sent == len(want)
        assert_one_card_each(mysql_url, want)
    finally:
        server.stop()


async def test_adaptive_rate_settles_under_the_provider_limit_with_no_user_failed(
    mysql_url: str,
    aws: dict[str, str],
    make_aws_job: Callable[..., Any],
) -> None:
    want = await seeded(mysql_url, 1500, seed=45)
    queue_url = await make_queues(aws)
    job: Runtime = await make_aws_job(aws, mail_url="ses://us-east-1", queue_url=queue_url)
    await job.mailer.open()  # type: ignore[union-attr]
    limit = 25.0  # the provider's real limit, unknown to batchrun
    recent: deque[float] = deque()
    throttle = answer_with(
        400, "TooManyRequestsException", {"message": "Maximum sending rate exceeded."}
    )

    def provider(request: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        while recent and now - recent[0] > 1.0:
            recent.popleft()
        if len(recent) >= limit:
            return throttle(request, **kwargs)
        recent.append(now)
        return None

    job.mailer.client.meta.events.register("before-send.sesv2.SendEmail", provider)  # type: ignore[union-attr]
    summary = await job.run(JUNE, Options(concurrency=20, rate=200.0))
    assert summary.throttles > 0, "starting far above the limit must be throttled"
    assert summary.failed == 0 and summary.emails_sent == len(want)
    assert summary.send_rate is not None and 0 < summary.send_rate < 200.0
    assert summary.to_json()["send_rate"] == summary.send_rate

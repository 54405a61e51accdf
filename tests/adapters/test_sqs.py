"""SqsQueue against moto's server through the real aioboto3 client."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aioboto3
import pytest
from aiobotocore.awsrequest import AioAWSResponse
from botocore.awsrequest import AWSResponse
from support.aws_server import MotoServer

from batchrun.db import connect
from batchrun.errors import ConfigError, QueueError
from batchrun.period import Unit
from batchrun.queue.base import QueueMessage, Received
from batchrun.queue.base import from_url as queue_from_url
from batchrun.queue.local import LocalQueue
from batchrun.queue.sqs import SqsQueue

UNITS: dict[str, Unit] = {"birthday": "month"}  # jobs a consumer parses bodies for

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY-SECRET"
ACCESS_KEY = "AKIASECRETACCESSKEY01"


@pytest.fixture
async def sqs(aws_env: dict[str, str]) -> AsyncIterator[Any]:
    """A plain aioboto3 client, to set queues up and look at them behind SqsQueue's back."""
    session = aioboto3.Session(
        aws_access_key_id=aws_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=aws_env["AWS_SECRET_ACCESS_KEY"],
        region_name=aws_env["AWS_REGION"],
    )
    async with session.client("sqs", endpoint_url=aws_env["AWS_ENDPOINT_URL"]) as client:
        yield client


@dataclass
class Queues:
    main: str
    dlq: str
    fifo: str
    fifo_dlq: str
    plain: str  # no redrive policy


async def _create_pair(client: Any, name: str, *, fifo: bool) -> tuple[str, str]:
    attributes = {"FifoQueue": "true"} if fifo else {}
    suffix = ".fifo" if fifo else ""
    dlq = (await client.create_queue(QueueName=f"{name}-dlq{suffix}", Attributes=attributes))[
        "QueueUrl"
    ]
    arn = (await client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]))[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})
    main = (
        await client.create_queue(
            QueueName=f"{name}{suffix}", Attributes={**attributes, "RedrivePolicy": policy}
        )
    )["QueueUrl"]
    return main, dlq


@pytest.fixture
async def queues(sqs: Any) -> Queues:
    main, dlq = await _create_pair(sqs, "retry", fifo=False)
    fifo, fifo_dlq = await _create_pair(sqs, "ordered", fifo=True)
    plain = (await sqs.create_queue(QueueName="plain"))["QueueUrl"]
    return Queues(main, dlq, fifo, fifo_dlq, plain)


@pytest.fixture
async def make_queue(aws_env: dict[str, str]) -> AsyncIterator[Callable[..., SqsQueue]]:
    """Factory: ``make_queue(url, **kwargs)`` -> an SqsQueue closed at teardown."""
    made: list[SqsQueue] = []

    def make(url: str, **kwargs: Any) -> SqsQueue:
        kwargs.setdefault("env", aws_env)
        kwargs.setdefault("wait_s", 0)
        queue = SqsQueue(url, **kwargs)
        made.append(queue)
        return queue

    yield make
    for queue in made:
        await queue.close()


def retry_body(user_id: int, attempt: int = 1) -> str:
    return QueueMessage(
        "retry", "birthday", "2025-06", entity_id=user_id, attempt=attempt
    ).to_json()


async def receive_all(queue: SqsQueue, *, visibility_s: float = 60) -> list[Received]:
    got: list[Received] = []
    while batch := await queue.receive(max_messages=10, visibility_s=visibility_s):
        got.extend(batch)
    return got


async def read_raw(client: Any, url: str) -> list[dict[str, Any]]:
    """Every visible message of ``url`` with its attributes (hidden afterwards)."""
    messages: list[dict[str, Any]] = []
    while True:
        response = await client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        if not response.get("Messages"):
            return messages
        messages.extend(response["Messages"])


# -- sending and receiving ----------------------------------------------------------------


async def test_send_25_received_exactly_once(
    queues: Queues, make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(queues.main)
    calls: list[int] = []
    await queue.open()
    queue.client.meta.events.register(
        "before-parameter-build.sqs.SendMessageBatch",
        lambda params, **_: calls.append(len(params["Entries"])),
    )
    bodies = [retry_body(uid) for uid in range(1, 26)]
    await queue.send(bodies)
    assert calls == [10, 10, 5]
    got = await receive_all(queue)
    assert sorted(r.body for r in got) == sorted(bodies)
    assert len({r.message_id for r in got}) == 25
    assert all(r.receive_count == 1 for r in got)
    assert await queue.depths() == (25, 0)


async def test_failed_entry_is_resent(queues: Queues, make_queue: Callable[..., SqsQueue]) -> None:
    queue = make_queue(queues.main)
    await queue.open()
    dropped: list[dict[str, Any]] = []
    sent_ids: list[list[str]] = []

    # The first batch call really sends every entry but one, and reports that one Failed,
    # as SQS does under partial failure; everything after goes through untouched.
    def drop_one(params: dict[str, Any], **_: Any) -> None:
        sent_ids.append([e["Id"] for e in params["Entries"]])
        if not dropped:
            dropped.append(params["Entries"][3])
            params["Entries"] = [e for e in params["Entries"] if e is not dropped[0]]

    def report_failed(parsed: dict[str, Any], **_: Any) -> None:
        if len(sent_ids) == 1:
            parsed.setdefault("Failed", []).append(
                {"Id": dropped[0]["Id"], "SenderFault": False, "Code": "InternalError"}
            )

    events = queue.client.meta.events
    events.register("before-parameter-build.sqs.SendMessageBatch", drop_one)
    events.register("after-call.sqs.SendMessageBatch", report_failed)
    bodies = [retry_body(uid) for uid in range(1, 13)]
    await queue.send(bodies)
    assert len(sent_ids) == 3  # 10 + 2, then the one failed entry alone
    assert sent_ids[2] == [dropped[0]["Id"]]
    got = await receive_all(queue)
    assert sorted(r.body for r in got) == sorted(bodies)


async def test_entry_that_keeps_failing_raises(
    queues: Queues, make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(queues.main)
    await queue.open()
    bad = retry_body(7)
    calls: list[int] = []

    # Every call loses the bad entry: dropped from a mixed batch (absent from the answer),
    # answered Failed without reaching moto when it is alone (as botocore's Stubber does).
    def drop_bad(params: dict[str, Any], **_: Any) -> None:
        params["Entries"] = [e for e in params["Entries"] if e["MessageBody"] != bad]
        calls.append(len(params["Entries"]))

    def fail_alone(**_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if calls[-1]:
            return None
        failed = {"Id": "1", "SenderFault": False, "Code": "InternalError", "Message": "x"}
        return AWSResponse("http://fake", 200, {}, None), {"Successful": [], "Failed": [failed]}

    events = queue.client.meta.events
    events.register("before-parameter-build.sqs.SendMessageBatch", drop_bad)
    events.register("before-call.sqs.SendMessageBatch", fail_alone)
    with pytest.raises(QueueError, match="1 of 3 messages not queued") as raised:
        await queue.send([retry_body(6), bad, retry_body(8)])
    assert raised.value.unsent == (1,)  # which one it was: the others were queued
    assert calls == [2, 0, 0, 0]  # the first send, then three resends of the bad entry
    assert sorted(r.body for r in await receive_all(queue)) == [retry_body(6), retry_body(8)]


async def test_throttled_batch_is_retried_by_botocore(
    queues: Queues, make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(queues.main)
    await queue.open()
    throttled: list[str] = []

    class Body:
        async def read(self) -> bytes:
            return json.dumps(
                {"__type": "ThrottlingException", "message": "Rate exceeded"}
            ).encode()

    # moto cannot throttle: answer the first request with SQS's throttling error instead.
    def throttle_once(request: Any, **_: Any) -> AioAWSResponse | None:
        if throttled:
            return None
        throttled.append(request.url)
        headers = {"Content-Type": "application/x-amz-json-1.0"}
        return AioAWSResponse(request.url, 400, headers, Body())

    queue.client.meta.events.register("before-send.sqs.SendMessageBatch", throttle_once)
    await queue.send([retry_body(1)])
    assert throttled
    assert [r.body for r in await receive_all(queue)] == [retry_body(1)]


async def test_retry_later_hides_and_receive_count_grows(
    queues: Queues, make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(queues.main)
    await queue.send([retry_body(1)])
    (first,) = await queue.receive(max_messages=10, visibility_s=60)
    assert first.receive_count == 1
    assert await queue.receive(max_messages=10, visibility_s=60) == []  # hidden
    await queue.retry_later(first, 0)
    (second,) = await queue.receive(max_messages=10, visibility_s=60)
    assert second.message_id == first.message_id
    assert second.receive_count == 2
    await queue.retry_later(second, 3600)
    assert await queue.receive(max_messages=10, visibility_s=60) == []
    assert await queue.depths() == (1, 0)


async def test_retry_later_on_a_stale_receipt_only_logs(
    queues: Queues, make_queue: Callable[..., SqsQueue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(queues.main)
    await queue.send([retry_body(1)])
    (item,) = await queue.receive(max_messages=1, visibility_s=60)
    await queue.delete([item])
    with caplog.at_level(logging.WARNING, logger="batchrun.queue.sqs"):
        await queue.retry_later(item, 10)
    assert "no longer ours" in caplog.text


async def test_delete_removes(queues: Queues, make_queue: Callable[..., SqsQueue]) -> None:
    queue = make_queue(queues.main)
    await queue.send([retry_body(uid) for uid in (1, 2, 3)])
    got = await receive_all(queue)
    await queue.delete(got[:2])
    assert await queue.depths() == (1, 0)
    await queue.retry_later(got[2], 0)
    assert [r.body for r in await receive_all(queue)] == [got[2].body]


async def test_failed_delete_is_logged_not_raised(
    queues: Queues, make_queue: Callable[..., SqsQueue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(queues.main)
    await queue.send([retry_body(1)])
    (item,) = await queue.receive(max_messages=1, visibility_s=60)
    stale = Received(item.message_id, "not-a-receipt", item.body, 1)
    with caplog.at_level(logging.WARNING, logger="batchrun.queue.sqs"):
        await queue.delete([stale])
    assert "could not delete" in caplog.text
    assert await queue.depths() == (1, 0)


# -- dead letters and depths --------------------------------------------------------------


async def test_max_receives_comes_from_the_redrive_policy(
    queues: Queues, make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(queues.main, max_receives=5)
    assert queue.max_receives == 5  # until opened
    await queue.open()
    assert queue.max_receives == 3
    assert queue.dlq_url == queues.dlq
    plain = make_queue(queues.plain, max_receives=7)
    await plain.open()
    assert (plain.max_receives, plain.dlq_url) == (7, None)


async def test_dead_letter_moves_to_the_dlq_with_reason(
    queues: Queues, make_queue: Callable[..., SqsQueue], sqs: Any
) -> None:
    queue = make_queue(queues.main)
    await queue.send([retry_body(1), retry_body(2)])
    item, other = await receive_all(queue)
    await queue.dead_letter(item, "gave up after 3 attempts: 451 mailbox busy")
    assert await queue.depths() == (1, 1)
    (dead,) = await read_raw(sqs, queues.dlq)
    assert dead["Body"] == item.body
    assert dead["MessageAttributes"]["reason"]["StringValue"] == (
        "gave up after 3 attempts: 451 mailbox busy"
    )
    await queue.retry_later(other, 0)
    assert [r.body for r in await receive_all(queue)] == [other.body]


async def test_send_dead_lands_on_the_dlq(
    queues: Queues, make_queue: Callable[..., SqsQueue], sqs: Any
) -> None:
    queue = make_queue(queues.main)
    await queue.send_dead([(retry_body(1), "550 no such user"), (retry_body(2), "rejected")])
    assert await queue.depths() == (0, 2)
    dead = await read_raw(sqs, queues.dlq)
    reasons = {m["Body"]: m["MessageAttributes"]["reason"]["StringValue"] for m in dead}
    assert reasons == {retry_body(1): "550 no such user", retry_body(2): "rejected"}


async def test_depths_count_waiting_in_flight_and_dead(
    queues: Queues, make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(queues.main)
    assert await queue.depths() == (0, 0)
    await queue.send([retry_body(uid) for uid in (1, 2, 3)])
    (item,) = await queue.receive(max_messages=1, visibility_s=60)
    assert await queue.depths() == (3, 0)  # two waiting, one in flight
    await queue.dead_letter(item, "poison: not JSON")
    assert await queue.depths() == (2, 1)


async def test_without_a_dlq_dead_letters_are_logged_and_dropped(
    queues: Queues, make_queue: Callable[..., SqsQueue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue(queues.plain)
    await queue.send(["not json"])
    (item,) = await queue.receive(max_messages=1, visibility_s=60)
    with caplog.at_level(logging.ERROR, logger="batchrun.queue.sqs"):
        await queue.dead_letter(item, "poison: not JSON")
        await queue.send_dead([(retry_body(9), "550 no such user")])
    assert "poison: not JSON" in caplog.text
    assert "550 no such user" in caplog.text
    assert await queue.depths() == (0, None)


# -- FIFO ---------------------------------------------------------------------------------


async def test_fifo_groups_by_user_and_deduplicates_a_resend(
    queues: Queues, make_queue: Callable[..., SqsQueue], sqs: Any
) -> None:
    queue = make_queue(queues.fifo)
    continuation = QueueMessage("continuation", "birthday", "2025-06", after_id=500).to_json()
    await queue.send([retry_body(42), continuation])
    await queue.send([retry_body(42)])  # the same failure again: SQS drops it
    await queue.send([retry_body(43, attempt=2), retry_body(43, attempt=3)])
    await queue.send([continuation])  # a second hand-off from the same cursor is kept
    messages = await read_raw(sqs, queues.fifo)
    groups = sorted((m["Attributes"]["MessageGroupId"], m["Body"]) for m in messages)
    assert groups == [
        ("birthday:2025-06", continuation),
        ("birthday:2025-06", continuation),
        ("birthday:42", retry_body(42)),
        ("birthday:43", retry_body(43, attempt=2)),
        ("birthday:43", retry_body(43, attempt=3)),
    ]
    dedup = {m["Attributes"]["MessageDeduplicationId"] for m in messages}
    assert len(dedup) == 5
    assert await queue.depths() == (5, 0)


async def test_fifo_groups_a_task_sent_again_apart_from_its_entitys_waiting_ones(
    queues: Queues, make_queue: Callable[..., SqsQueue], sqs: Any
) -> None:
    queue = make_queue(queues.fifo)
    waiting = QueueMessage("entity_task", "steps", "", entity_id=7, key="k2")
    lost = QueueMessage("entity_task", "steps", "", entity_id=7, key="k1", resent=True)
    await queue.send([waiting.to_json(), lost.to_json()])
    messages = await read_raw(sqs, queues.fifo)
    groups = sorted((m["Attributes"]["MessageGroupId"], m["Body"]) for m in messages)
    assert groups == [("steps:7", waiting.to_json()), ("steps:7:resent", lost.to_json())]
    assert QueueMessage.from_json(lost.to_json(), {"steps": "day"}) == lost  # type: ignore[dict-item]


async def test_fifo_dead_letter_and_send_dead(
    queues: Queues, make_queue: Callable[..., SqsQueue], sqs: Any
) -> None:
    queue = make_queue(queues.fifo)
    await queue.send(["not json"])
    (item,) = await queue.receive(max_messages=1, visibility_s=60)
    await queue.dead_letter(item, "poison: not JSON")
    await queue.send_dead([(retry_body(5), "550 no such user")])
    assert await queue.depths() == (0, 2)
    dead = await read_raw(sqs, queues.fifo_dlq)
    assert {m["Body"] for m in dead} == {"not json", retry_body(5)}


# -- failures, configuration, imports -----------------------------------------------------


async def test_server_down_raises_queue_error_quickly_without_secrets(sqs: Any) -> None:
    server = MotoServer().start()
    try:
        env = {**server.env, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        session = aioboto3.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
        )
        async with session.client("sqs", endpoint_url=server.endpoint) as client:
            url = (await client.create_queue(QueueName="down"))["QueueUrl"]
        queue = SqsQueue(url, env=env, wait_s=0)
        try:
            await queue.open()
            server.stop()
            started = time.monotonic()
            with pytest.raises(QueueError) as info:
                await queue.send([retry_body(1)])
            assert time.monotonic() - started < 15
        finally:
            await queue.close()
    finally:
        server.stop()
    text = str(info.value)
    assert "down" in text
    assert SECRET not in text and ACCESS_KEY not in text
    assert info.value.__cause__ is not None


async def test_missing_queue_is_a_queue_error(
    aws_env: dict[str, str], make_queue: Callable[..., SqsQueue]
) -> None:
    queue = make_queue(f"{aws_env['AWS_ENDPOINT_URL']}/123456789012/nope")
    with pytest.raises(QueueError, match="nope"):
        await queue.send([retry_body(1)])


def test_region_and_endpoint_from_url_and_env() -> None:
    aws = SqsQueue("https://sqs.eu-west-3.amazonaws.com/123456789012/q.fifo", env={})
    assert (aws.region, aws.endpoint, aws.fifo, aws.name) == ("eu-west-3", None, True, "q.fifo")
    env = {"AWS_REGION": "us-west-2", "AWS_ENDPOINT_URL_SQS": "http://localhost:4566"}
    local = SqsQueue("http://127.0.0.1:9/123456789012/q", env=env)
    assert (local.region, local.endpoint, local.fifo) == (
        "us-west-2",
        "http://localhost:4566",
        False,
    )
    bare = SqsQueue("http://127.0.0.1:9/123456789012/q", env={"AWS_DEFAULT_REGION": "eu-north-1"})
    assert (bare.region, bare.endpoint) == ("eu-north-1", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="AWS_REGION"):
        SqsQueue("http://127.0.0.1:9/123456789012/q", env={})
    with pytest.raises(ConfigError, match="bad SQS queue URL"):
        SqsQueue("https://sqs.us-east-1.amazonaws.com/q", env={})


async def test_from_url_routes_sqs_urls_and_defaults_to_the_table(sqlite_url: str) -> None:
    database = await connect(sqlite_url, create=True)
    try:
        env = {"AWS_REGION": "us-east-1"}
        sqs_queue = queue_from_url(
            "http://127.0.0.1:9/123456789012/q", db=database, max_receives=4, env=env
        )
        assert isinstance(sqs_queue, SqsQueue)
        assert sqs_queue.max_receives == 4
        await sqs_queue.close()
        assert isinstance(queue_from_url(None, db=database, max_receives=5), LocalQueue)
        assert isinstance(queue_from_url("", db=database, max_receives=5), LocalQueue)
        with pytest.raises(ConfigError):
            queue_from_url("sqs://q", db=database, max_receives=5)
        with pytest.raises(ConfigError):
            queue_from_url("amqp://u:pw@host/q", db=database, max_receives=5)
    finally:
        await database.close()


def test_base_and_local_do_not_import_aioboto3() -> None:
    code = (
        "import sys, batchrun.queue.base, batchrun.queue.local; "
        "bad = [m for m in ('aioboto3', 'aiobotocore', 'botocore') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr

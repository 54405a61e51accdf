"""Queue faults: a task for an entity the page does not return changes
nothing; a message for a job this process does not know stays on the queue; dead letters
are listed, redriven and purged (local queue and SQS)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aioboto3
import pytest
from support.aws_server import MotoServer, make_queue_with_dlq
from support.birthday import seed_users
from support.cli import run_cli
from support.db import query, table_digest
from support.periods import month
from support.smtp_server import SmtpTestServer, fail_recipients

from batchrun.db import Store, connect
from batchrun.db.store import State
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.queue import dead
from batchrun.queue.base import QueueMessage
from batchrun.queue.sqs import SqsQueue
from batchrun.runtime import Options, Runtime

APRIL = month(2025, 4)
DECEMBER = month(2025, 12)


def born_in(db_url: str, month: int) -> int:
    """An active user with an address born in ``month``."""
    rows = query(
        db_url,
        "SELECT id FROM user WHERE birth_month = %s AND status = 10 AND email LIKE %s ORDER BY id",
        month,
        "%@%.%",
    )
    return int(rows[0][0])


def ledger_of(db_url: str, uid: int) -> list[tuple[Any, ...]]:
    return query(
        db_url,
        "SELECT once_key, period, state FROM batchrun_ledger WHERE entity_id = %s",
        uid,
    )


def task(uid: int, period: str = "2025-12", job: str = "birthday", kind: str = "task") -> str:
    return QueueMessage(kind, job, period, entity_id=uid).to_json()  # type: ignore[arg-type]


async def test_a_task_for_the_wrong_period_changes_nothing_and_april_sends(
    store: Store, db_url: str, smtp_server: SmtpTestServer, make_job: Callable[..., Any]
) -> None:
    await seed_users(store, 300, seed=11)
    uid = born_in(db_url, 4)
    rt: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    assert rt.queue is not None
    before = table_digest(db_url, ["batchrun_ledger", "gift_card"])
    await rt.queue.send([task(uid), task(uid, kind="retry")])

    result = await rt.retry(Options(concurrency=4))
    assert (result.not_eligible, result.processed, result.failed) == (1, 0, 0)
    assert result.exit_code == 0
    assert table_digest(db_url, ["batchrun_ledger", "gift_card"]) == before
    assert ledger_of(db_url, uid) == []
    assert await rt.queue.depths() == (0, 0)
    assert smtp_server.messages == []

    summary = await rt.run(APRIL, Options(concurrency=4))
    assert summary.exit_code == 0
    assert ledger_of(db_url, uid) == [("2025", "2025-04", int(State.SUCCEEDED))]
    assert smtp_server.sends_per_user()[uid] == 1


async def test_submit_refuses_ids_the_page_does_not_return(
    store: Store, db_url: str, make_job: Callable[..., Any], tmp_path: Any
) -> None:
    await seed_users(store, 300, seed=11)
    april, december = born_in(db_url, 4), born_in(db_url, 12)
    env = {"BATCHRUN_DB": db_url, "BATCHRUN_MAIL": f"file://{tmp_path}/out"}
    refused = run_cli(
        "submit", "birthday", "--period", "2025-12", "--id", str(december),
        "--id", str(april), "--id", "999999", env=env,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert f"id {april}, 999999 " in lines[0] and str(december) not in lines[0]
    assert query(db_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 0

    ok = run_cli("submit", "birthday", "--period", "2025-12", "--id", str(december), env=env)
    assert ok.returncode == 0, ok.stderr
    assert query(db_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 1


# -- unknown jobs -----------------------------------------------------------------------------


async def test_an_unknown_job_stays_on_the_local_queue_and_retry_exits_1(
    store: Store, db_url: str, make_job: Callable[..., Any], tmp_path: Any
) -> None:
    rt: Runtime = await make_job(db_url)
    assert rt.queue is not None
    await rt.queue.send([task(uid, "2025-06", job="keyerr2") for uid in (1, 2, 3)])
    env = {"BATCHRUN_DB": db_url, "BATCHRUN_MAIL": f"file://{tmp_path}/out"}
    result = run_cli("retry", "--json", env=env)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert (data["unknown_job"], data["dead_lettered"], data["processed"]) == (3, 0, 0)
    (line,) = [x for x in result.stderr.splitlines() if x.strip()]
    assert "'keyerr2'" in line and "--jobs" in line
    waiting = query(db_url, "SELECT dead, receive_count FROM batchrun_queue ORDER BY id")
    assert waiting == [(0, 1)] * 3, "left on the queue, never dead-lettered"
    assert await rt.queue.receive(max_messages=10, visibility_s=5) == [], "hidden for later"


# -- dead letters on the local queue ----------------------------------------------------------


async def test_dead_list_redrive_purge_on_the_local_queue(
    store: Store, db_url: str, smtp_server: SmtpTestServer, make_job: Callable[..., Any]
) -> None:
    await seed_users(store, 300, seed=11)
    uid = born_in(db_url, 4)
    (address,) = query(db_url, "SELECT email FROM user WHERE id = %s", uid)[0]
    rt: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    assert rt.queue is not None
    smtp_server.set_policy(fail_recipients({address: "550 5.1.1 No such user"}))
    await rt.run(APRIL, Options(concurrency=4))
    (letter,) = await dead.list_dead(rt.queue)
    assert (letter.job, letter.period, letter.entity_id) == ("birthday", "2025-04", uid)
    assert "550" in letter.reason
    assert ledger_of(db_url, uid) == [("2025", "2025-04", int(State.FAILED))]

    smtp_server.set_policy(None)
    moved = await dead.redrive(rt.queue, rt.store, ids=[letter.id])
    assert [m.id for m in moved] == [letter.id]
    assert await dead.list_dead(rt.queue) == []
    assert ledger_of(db_url, uid) == [("2025", "2025-04", int(State.RETRYING))]
    result = await rt.retry(Options(concurrency=4))
    assert (result.succeeded, result.dead_lettered) == (1, 0)
    assert smtp_server.sends_per_user()[uid] == 1

    await rt.queue.send_dead([(task(uid), "poison: test"), (task(uid + 1), "poison: test")])
    assert len(await dead.list_dead(rt.queue)) == 2
    assert await dead.purge(rt.queue) == 2
    assert await rt.queue.depths() == (0, 0)


def test_dead_commands_on_the_command_line(sqlite_url: str, tmp_path: Any) -> None:
    env = {"BATCHRUN_DB": sqlite_url, "BATCHRUN_MAIL": f"file://{tmp_path}/out"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    query(
        sqlite_url,
        "INSERT INTO batchrun_queue (body, visible_at, receive_count, dead, dead_reason, "
        "created_at) VALUES (%s, 0, 5, 1, %s, 0)",
        task(7),
        "gave up after 5 attempts",
    )
    listed = run_cli("dead", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert (entry["job"], entry["entity_id"], entry["reason"]) == (
        "birthday",
        7,
        "gave up after 5 attempts",
    )
    refused = run_cli("dead", "purge", env=env)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    neither = run_cli("dead", "redrive", env=env)
    assert neither.returncode == 2 and "--all" in neither.stderr
    missing = run_cli("dead", "redrive", "--id", "999", env=env)
    assert missing.returncode == 1 and "999" in missing.stderr
    moved = run_cli("dead", "redrive", "--all", "--json", env=env)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["redriven"] == 1
    assert query(sqlite_url, "SELECT dead, receive_count FROM batchrun_queue") == [(0, 0)]
    helped = run_cli("dead", "--help", env=env)
    assert "redrive" in helped.stdout and "purge" in helped.stdout


# -- SQS -------------------------------------------------------------------------------------


@pytest.fixture
async def sqs_pair(moto_server: MotoServer) -> AsyncIterator[tuple[SqsQueue, Any, str]]:
    """An SqsQueue whose RedrivePolicy names a DLQ (maxReceiveCount 3), a raw client, and
    the DLQ's URL."""
    moto_server.reset()
    env = moto_server.env
    session = aioboto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )
    async with session.client("sqs", endpoint_url=env["AWS_ENDPOINT_URL"]) as client:
        dlq = (await client.create_queue(QueueName="retry-dlq"))["QueueUrl"]
        arn = (await client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]["QueueArn"]
        policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})
        main = (await client.create_queue(QueueName="retry", Attributes={"RedrivePolicy": policy}))[
            "QueueUrl"
        ]
        queue = SqsQueue(main, env=env, wait_s=0)
        try:
            yield queue, client, dlq
        finally:
            await queue.close()


async def _count(client: Any, url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    got = await client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
    return sum(int(got["Attributes"][n]) for n in names)


async def test_sqs_keep_resends_a_copy_before_the_redrive_limit(
    sqs_pair: tuple[SqsQueue, Any, str],
) -> None:
    queue, client, dlq = sqs_pair
    await queue.send([task(1, job="other")])
    for receives in range(1, 8):
        (item,) = await queue.receive(max_messages=1, visibility_s=30)
        assert item.receive_count < 3, "a kept message never reaches maxReceiveCount"
        await queue.keep(item, 0)
        assert receives < 8
    assert await _count(client, dlq) == 0
    assert await _count(client, queue.queue_url) == 1


async def test_sqs_keeps_the_wait_of_a_copy_sent_before_the_redrive_limit(
    sqs_pair: tuple[SqsQueue, Any, str],
) -> None:
    """A kept message whose next receive could reach maxReceiveCount goes back as a fresh
    copy: on a standard queue it still stays away for the wait (DelaySeconds), rather than
    coming back at once for a receive that only puts it away again."""
    queue, _, _ = sqs_pair
    await queue.send([task(1, job="other")])
    for _ in range(2):  # the second receive is one before the limit of 3
        (item,) = await queue.receive(max_messages=1, visibility_s=30)
        await queue.keep(item, 2)
        if item.receive_count == 1:
            await asyncio.sleep(2.5)  # hidden for 2 s: back after that
    assert await queue.receive(max_messages=1, visibility_s=30) == []  # the copy waits
    await asyncio.sleep(2.5)
    (copy,) = await queue.receive(max_messages=1, visibility_s=30)
    assert copy.receive_count == 1 and copy.body == item.body


async def test_sqs_fifo_keeps_with_a_copy_before_the_redrive_limit(
    moto_server: MotoServer,
) -> None:
    """A FIFO queue takes no per-message delay (SQS refuses DelaySeconds there): the copy
    sent before the redrive limit goes without one, and is there to be received."""
    moto_server.reset()
    url, _ = make_queue_with_dlq(moto_server, max_receives=3, fifo=True)
    queue = SqsQueue(url, env=moto_server.env, wait_s=0)
    try:
        await queue.send([task(1, job="other")])
        for receives in (1, 2):
            (item,) = await queue.receive(max_messages=1, visibility_s=30)
            assert item.receive_count == receives
            await queue.keep(item, 0 if receives == 1 else 5)  # the second: the copy
        (copy,) = await queue.receive(max_messages=1, visibility_s=30)
        assert copy.receive_count == 1 and copy.body == item.body
    finally:
        await queue.close()


async def test_sqs_unknown_job_is_kept_and_counted(
    sqs_pair: tuple[SqsQueue, Any, str], sqlite_url: str, make_settings: Callable[..., Any]
) -> None:
    queue, client, dlq = sqs_pair
    database = await connect(sqlite_url, create=True)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        settings = make_settings(sqlite_url, retry_queue_url=queue.queue_url)
        rt = Runtime(Birthday(), store, mailer_from_url(settings.mail_url), queue, settings)
        await queue.send([task(1, job="keyerr2"), task(2, job="keyerr2")])
        result = await rt.retry(Options(concurrency=2))
        assert (result.unknown_job, result.dead_lettered, result.exit_code) == (2, 0, 1)
        assert "'keyerr2'" in (result.unknown_line() or "")
        assert await _count(client, dlq) == 0
        assert await _count(client, queue.queue_url) == 2
    finally:
        await database.close()


async def test_sqs_dead_letters_list_redrive_purge(
    sqs_pair: tuple[SqsQueue, Any, str], sqlite_url: str
) -> None:
    queue, client, dlq = sqs_pair
    database = await connect(sqlite_url, create=True)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        await queue.send_dead([(task(n, kind="retry"), f"550 for {n}") for n in (1, 2, 3)])
        letters = await dead.list_dead(queue)
        assert sorted((x.entity_id, x.reason) for x in letters) == [
            (1, "550 for 1"),
            (2, "550 for 2"),
            (3, "550 for 3"),
        ]
        assert await _count(client, dlq) == 3
        assert len(await dead.list_dead(queue)) == 3, "listing leaves them visible"
        chosen = next(x for x in letters if x.entity_id == 2)
        moved = await dead.redrive(queue, store, ids=[chosen.id])
        assert [m.entity_id for m in moved] == [2]
        (back,) = await queue.receive(max_messages=10, visibility_s=30)
        assert json.loads(back.body)["id"] == 2
        assert await _count(client, dlq) == 2
        assert await dead.purge(queue) == 2
        assert await dead.list_dead(queue) == []
    finally:
        await database.close()

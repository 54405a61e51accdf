"""Hostile SES events: each record stands alone, so crafted ones are
dead-lettered (CLI) or reported failed (Lambda) alone and the genuine permanent bounces
beside them are applied; addresses are keyed in one form (IDNA, NFC, case-folded); the
Lambda applies SES events only from BATCHRUN_EVENTS_QUEUE (and BATCHRUN_EVENTS_TOPIC)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.birthday import seed_users
from support.cli import run_cli
from support.db import query
from support.lambda_context import FakeContext
from support.periods import month
from support.ses_events import mailed, mailed_run, sample

from batchrun import aws_lambda
from batchrun.db import Store, connect
from batchrun.db.store import State
from batchrun.errors import DatabaseError
from batchrun.events import ses as events
from batchrun.jobs.birthday import Birthday
from batchrun.queue.base import Received
from batchrun.runtime import Options

JUNE = month(2025, 6)
EVENTS_ARN = "arn:aws:sqs:us-east-1:123456789012:batchrun-ses-events"
RETRY_ARN = "arn:aws:sqs:us-east-1:123456789012:batchrun-retry"
TOPIC = "arn:aws:sns:us-east-1:123456789012:batchrun-ses-events"


def crafted() -> list[str]:
    """Bodies made to break the consumer: each must fail alone."""
    return [
        # an X-Batchrun-Id (and Message-ID) naming a 19-digit id, over BIGINT's range
        sample(
            "sns_event_permanent_bounce", address="ok@example.com", entity=9_999_999_999_999_999_999
        ),
        # a lone surrogate, a NUL in the address (JSON escapes: SQS carries them)
        sample("raw_event_permanent_bounce", address="x\\ud800@example.com", entity=7),
        sample("raw_event_permanent_bounce", address="x\\u0000y@example.com", entity=8),
        # a domain of 200 x "İ": no IDNA form, and twice as long once case-folded
        sample("sns_event_permanent_bounce", address="jo@" + "İ" * 200 + ".example", entity=9),
        "{not json",
    ]


async def test_crafted_records_are_dead_lettered_alone_and_the_genuine_bounces_apply(
    db_url: str, make_job: Callable[..., Any], moto_server: MotoServer, aws_env: dict[str, str]
) -> None:
    await mailed_run(make_job, db_url)
    genuine = mailed(db_url)[:5]
    assert len(genuine) == 5
    url, dlq = make_queue_with_dlq(moto_server, "ses-events", dlq_name="ses-events-dlq")
    sqs = aws_client(moto_server)
    bad = crafted()
    good = [sample("sns_event_permanent_bounce", address=a, entity=uid) for uid, a in genuine]
    # Interleaved, so every receive of ten holds both kinds.
    bodies = [body for pair in zip(bad, good, strict=True) for body in pair]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)

    env = {**aws_env, "BATCHRUN_DB": db_url}
    result = await asyncio.to_thread(run_cli, "events", "--queue", url, "--json", env=env)
    assert result.returncode == 0, result.stderr  # poison is dead-lettered: drained
    assert "Traceback" not in result.stderr
    summary = json.loads(result.stdout)
    assert (summary["read"], summary["bounces"], summary["suppressed"]) == (10, 5, 5)
    assert (summary["recorded"], summary["poison"], summary["failed"]) == (5, 5, 0)
    assert "5 messages were no SES event" in result.stderr

    dead = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in dead) == sorted(bad)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    rows = dict(query(db_url, "SELECT address, reason FROM batchrun_suppression"))
    assert rows == {address.lower(): "bounce" for _, address in genuine}
    marked = query(
        db_url,
        "SELECT entity_id FROM batchrun_ledger WHERE job = 'birthday' AND mail_event = 'bounce'",
    )
    assert sorted(int(r[0]) for r in marked) == sorted(uid for uid, _ in genuine)


def lambda_record(n: int, body: str, source: str = EVENTS_ARN) -> dict[str, Any]:
    return {
        "messageId": f"m{n}",
        "receiptHandle": f"rh{n}",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "eventSource": "aws:sqs",
        "eventSourceARN": source,
    }


async def test_the_lambda_reports_each_crafted_record_alone_and_applies_the_rest(
    db_url: str, make_job: Callable[..., Any], tmp_path: Path
) -> None:
    await mailed_run(make_job, db_url, users=300)
    users = mailed(db_url)
    genuine, (retry_uid, retry_mail), (other_uid, other_mail) = users[:5], users[5], users[6]
    records = [lambda_record(n, body) for n, body in enumerate(crafted(), 1)]
    records += [
        lambda_record(10 + n, sample("sns_event_permanent_bounce", address=addr, entity=uid))
        for n, (uid, addr) in enumerate(genuine)
    ]
    # An SES-shaped body on the retry queue: whoever may `submit` must not suppress with it.
    on_retry = sample("sns_event_permanent_bounce", address=retry_mail, entity=retry_uid)
    records.append(lambda_record(20, on_retry, source=RETRY_ARN))
    # A genuine-looking notification from another SNS topic than BATCHRUN_EVENTS_TOPIC.
    other_topic = sample("sns_event_permanent_bounce", address=other_mail, entity=other_uid)
    records.append(lambda_record(21, other_topic.replace(TOPIC, TOPIC + "-stranger")))
    environ = {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'out'}",
        "BATCHRUN_EVENTS_QUEUE": EVENTS_ARN,
        "BATCHRUN_EVENTS_TOPIC": TOPIC,
    }
    result = await asyncio.to_thread(
        aws_lambda.handle, {"Records": records}, FakeContext(60, "req-events"), environ=environ
    )

    failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
    # The raw crafted ones name no topic: refused on that ground already, as they should be.
    # On the retry queue the SES-shaped body is poison: dead-lettered at once, not applied.
    assert failed == {"m1", "m2", "m3", "m4", "m5", "m21"}
    dead = query(db_url, "SELECT body, dead_reason FROM batchrun_queue WHERE dead = 1")
    assert [(body, str(reason).startswith("poison: ")) for body, reason in dead] == [
        (on_retry, True)
    ]
    rows = dict(query(db_url, "SELECT address, reason FROM batchrun_suppression"))
    assert rows == {address.lower(): "bounce" for _, address in genuine}
    ledger = query(
        db_url,
        "SELECT COUNT(*) FROM batchrun_ledger WHERE job = 'birthday' AND mail_event IS NOT NULL",
    )
    assert int(ledger[0][0]) == 5


def test_crafted_bodies_are_poison_in_parse_even_without_a_topic() -> None:
    for body in crafted():
        with pytest.raises(events.PoisonEvent):
            events.parse(body)
    raw = sample("raw_event_permanent_bounce", address="ada@example.com", entity=4)
    assert events.parse(raw).addresses == ("ada@example.com",)
    with pytest.raises(events.PoisonEvent, match="BATCHRUN_EVENTS_TOPIC"):
        events.parse(raw, topic=TOPIC)  # raw delivery names no topic to check
    wrapped = sample("sns_event_permanent_bounce", address="ada@example.com", entity=4)
    assert events.parse(wrapped, topic=TOPIC).kind == "bounce"


async def test_a_bounce_in_a_label_form_suppresses_the_unicode_address_and_jo_is_not_mailed(
    db_url: str, make_job: Callable[..., Any]
) -> None:
    database = await connect(db_url, create=True)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        await seed_users(store, 120, seed=3)
    finally:
        await database.close()
    june = query(
        db_url,
        "SELECT id FROM user WHERE birth_month = 6 AND status = 10 AND email IS NOT NULL "
        "ORDER BY id LIMIT 2",
    )
    jo, ann = int(june[0][0]), int(june[1][0])
    query(db_url, "UPDATE user SET email = %s WHERE id = %s", "Jo@Bücher.example", jo)
    query(db_url, "UPDATE user SET email = %s WHERE id = %s", "ANN@Example.com", ann)
    runtime = await make_job(db_url)
    # Last year's mail bounced: SES reports the address as SMTP carried it, in A-labels.
    summary = events.EventsSummary()
    for address in ("jo@xn--bcher-kva.example", "ann@example.COM"):
        body = sample("raw_event_permanent_bounce", address=address, entity=0)
        applied = await events.apply_items(runtime.store, [_received(body)], summary)
        assert len(applied.done) == 1, applied
    assert summary.suppressed == 2

    result = await runtime.run(JUNE, Options(concurrency=4))
    assert result.exit_code == 0
    states = dict(
        query(
            db_url,
            "SELECT entity_id, last_error FROM batchrun_ledger WHERE job = 'birthday' "
            "AND entity_id IN (%s, %s) AND state = %s",
            jo,
            ann,
            int(State.SKIPPED),
        )
    )
    assert states == {jo: "suppressed: bounce", ann: "suppressed: bounce"}
    cards = query(
        db_url,
        "SELECT COUNT(*) FROM gift_card WHERE idempotency_key IN (%s, %s)",
        f"birthday:2025:{jo}",
        f"birthday:2025:{ann}",
    )
    assert int(cards[0][0]) == 0


def _received(body: str) -> Received:
    return Received(message_id="x", receipt="r", body=body, receive_count=1)


class FlakyStore:
    """A store whose writes fail for one address (the database refusing that value, or
    going away mid-batch): enough of Store for ``events.apply``."""

    def __init__(self, failing: str) -> None:
        self.failing = failing
        self.suppressed: list[str] = []

    async def suppress(self, address: str, *, reason: str, source: str = "") -> bool:
        if address == self.failing:
            raise DatabaseError("database sqlite:///x: value refused")
        self.suppressed.append(address)
        return True

    async def record_mail_event(self, **_: Any) -> bool:
        return True


async def test_a_record_the_database_fails_on_stays_queued_alone_the_rest_apply() -> None:
    store = FlakyStore("b@example.com")
    items = [
        _received(sample("raw_event_permanent_bounce", address=f"{who}@example.com", entity=n))
        for n, who in enumerate("abc", 1)
    ]
    summary = events.EventsSummary()
    applied = await events.apply_items(store, items, summary)  # type: ignore[arg-type]
    assert store.suppressed == ["a@example.com", "c@example.com"]
    assert (len(applied.done), len(applied.poison), len(applied.failed)) == (2, 0, 1)
    assert applied.failed[0][0] is items[1]
    assert (summary.bounces, summary.suppressed, summary.failed) == (2, 2, 1)
    assert summary.exit_code == 1  # not applied, left on the queue: not "all done"


async def test_cli_events_takes_only_the_topic_batchrun_events_topic_names(
    sqlite_url: str, make_job: Callable[..., Any], moto_server: MotoServer, aws_env: dict[str, str]
) -> None:
    await mailed_run(make_job, sqlite_url)
    (a, a_mail), (b, b_mail) = mailed(sqlite_url)[:2]
    url, dlq = make_queue_with_dlq(moto_server, "ses-events", dlq_name="ses-events-dlq")
    sqs = aws_client(moto_server)
    ours = sample("sns_event_permanent_bounce", address=a_mail, entity=a)
    stranger = sample("sns_event_permanent_bounce", address=b_mail, entity=b).replace(
        TOPIC, TOPIC + "-stranger"
    )
    for body in (ours, stranger):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    env = {**aws_env, "BATCHRUN_DB": sqlite_url, "BATCHRUN_EVENTS_TOPIC": TOPIC}
    result = await asyncio.to_thread(run_cli, "events", "--queue", url, "--json", env=env)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["suppressed"], summary["poison"]) == (1, 1)
    rows = dict(query(sqlite_url, "SELECT address, reason FROM batchrun_suppression"))
    assert rows == {a_mail.lower(): "bounce"}
    (dead,) = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
    assert dead["Body"] == stranger

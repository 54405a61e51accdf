"""The Lambda handler with events from tests/support/events/: MariaDB, moto's SQS, a real SMTP
server."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import pytest
from support import EVENTS
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.birthday import card_counts, eligible_ids, seed_users
from support.checks import assert_one_card_and_one_email_each
from support.db import query
from support.lambda_context import FakeContext, as_sqs_event, drain_as_sqs_events
from support.ports import free_port
from support.smtp_server import SmtpTestServer

from batchrun import aws_lambda
from batchrun.db import Store, connect
from batchrun.errors import BatchrunError
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import valid_address
from batchrun.runtime import resources


def load_event(name: str, **replace: object) -> dict[str, Any]:
    text = (EVENTS / name).read_text()
    for key, value in replace.items():
        text = text.replace(key, str(value))
    return dict(json.loads(text))


@pytest.fixture
def sqs(moto_server: MotoServer) -> Any:
    moto_server.reset()
    return aws_client(moto_server)


@pytest.fixture
def queue_url(sqs: Any, moto_server: MotoServer) -> str:
    return make_queue_with_dlq(moto_server, visibility_s=60)[0]


@pytest.fixture
def environ(
    mysql_url: str, smtp_server: SmtpTestServer, moto_server: MotoServer, queue_url: str
) -> dict[str, str]:
    """The function's configuration, as the SAM template would set it."""
    return {
        **moto_server.env,
        "BATCHRUN_DB": mysql_url,
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_RETRY_QUEUE": queue_url,
        "BATCHRUN_CONCURRENCY": "20",
        "BATCHRUN_LEASE_S": "2",
    }


def prepare(db_url: str, users: int, seed: int) -> set[int]:
    """Migrate, seed, and return the users the month must reach."""

    async def go() -> None:
        database = await connect(db_url, create=True)
        try:
            store = Store(database)
            await store.migrate([Birthday()])
            await seed_users(store, users, seed=seed)
        finally:
            await database.close()

    asyncio.run(go())
    emails = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = 6"))
    return {uid for uid in eligible_ids(db_url, 6) if valid_address(emails[uid])}


def test_scheduled_event_completes_the_month(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
    sqs: Any,
    queue_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    want = prepare(mysql_url, 3000, seed=31)
    result = aws_lambda.handle(load_event("schedule.json"), FakeContext(300), environ=environ)
    assert result["month"] == "2025-06" and result["dry_run"] is False
    assert result["emails_sent"] == result["cards_created"] == len(want)
    assert_one_card_and_one_email_each(mysql_url, smtp_server, want)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (log_line,) = [line for line in lines if line.get("status") == "done"]
    assert log_line["request_id"] == "req-1" and log_line["event"] == "schedule"
    (metrics,) = [line for line in lines if "_aws" in line]
    names = {m["Name"] for m in metrics["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"UsersProcessed", "CardsCreated", "EmailsSent", "Failures", "Duration"} <= names
    assert metrics["EmailsSent"] == metrics["Succeeded"] == len(want)


def test_on_demand_dry_run_touches_nothing(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
) -> None:
    want = prepare(mysql_url, 1200, seed=32)
    result = aws_lambda.handle(
        load_event("on_demand_dry_run.json"), FakeContext(60), environ=environ
    )
    assert result["dry_run"] is True and result["eligible"] >= len(want)
    assert result["cards_created"] == result["emails_sent"] == 0
    assert card_counts(mysql_url, 2025) == {}
    assert smtp_server.messages == []


def test_a_warm_function_checks_the_schema_once_in_a_while(
    mysql_url: str, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm Lambda opens the database for every event: the schema check (some 70
    statements) runs on the first, then again once SCHEMA_CHECKED_S has passed."""
    prepare(mysql_url, 200, seed=33)
    checks: list[str] = []
    real = Store.check_migrated

    async def counted(self: Store, jobs: Any = ()) -> None:
        checks.append(self.db.url)
        await real(self, jobs)

    monkeypatch.setattr(Store, "check_migrated", counted)
    event = load_event("on_demand_dry_run.json")
    for _ in range(3):
        assert aws_lambda.handle(event, FakeContext(60), environ=environ)["dry_run"] is True
    assert len(checks) == 1
    monkeypatch.setattr(resources, "SCHEMA_CHECKED_S", 0.0)
    aws_lambda.handle(event, FakeContext(60), environ=environ)
    assert len(checks) == 2


def test_deadline_hands_off_and_sqs_invocations_complete_the_month(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
    sqs: Any,
    queue_url: str,
) -> None:
    want = prepare(mysql_url, 9000, seed=33)
    smtp_server.set_latency(0.1)  # ~200 emails/s at concurrency 20 at best: several calls
    # 20x a send's latency: in-flight sends get 70% of the margin to finish, room for a
    # loaded machine (one cut off after the server took it would be sent twice).
    environ = environ | {"BATCHRUN_DEADLINE_MARGIN_MS": "2000"}
    started = time.monotonic()
    first = aws_lambda.handle(load_event("schedule.json"), FakeContext(4), environ=environ)
    assert time.monotonic() - started < 4.0, "the handler must return before its deadline"
    assert first["continuation"] is True and first["stopped"]
    assert 0 < first["emails_sent"] < len(want)

    results = drain_as_sqs_events(sqs, queue_url, environ, seconds=4)
    assert len(results) >= 2, "the month should need more than one more invocation"
    assert all(r["batchItemFailures"] == [] for r in results)
    assert_one_card_and_one_email_each(mysql_url, smtp_server, want)


def test_a_mail_server_down_at_the_schedule_hands_the_month_to_the_queue(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
    sqs: Any,
    queue_url: str,
) -> None:
    want = prepare(mysql_url, 600, seed=35)
    port = free_port()
    down = environ | {"BATCHRUN_MAIL": f"smtp://127.0.0.1:{port}"}
    result = aws_lambda.handle(load_event("schedule.json"), FakeContext(60), environ=down)
    assert (
        result["stopped"] == f"mail: cannot connect to smtp://127.0.0.1:{port}: Connection refused"
    )
    assert result["continuation"] is True and result["month"] == "2025-06"
    assert result["eligible"] == result["cards_created"] == result["emails_sent"] == 0
    assert query(mysql_url, "SELECT COUNT(*) FROM batchrun_ledger") == [(0,)], "nothing claimed"
    assert query(mysql_url, "SELECT outcome, exit_code FROM batchrun_run") == [("retrying", 3)]

    results = drain_as_sqs_events(sqs, queue_url, environ, seconds=60)
    assert len(results) == 1 and results[0]["batchItemFailures"] == []
    assert_one_card_and_one_email_each(mysql_url, smtp_server, want)


def test_sqs_invocations_while_the_mail_server_is_down_dead_letter_nothing(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
    sqs: Any,
    queue_url: str,
) -> None:
    """Each invocation failed the whole batch while the mail server was down: after the
    redrive policy's five receives the continuation waiting for it was dead-lettered,
    and the month with it. Now every record is kept, as a worker waits an outage out."""
    want = prepare(mysql_url, 600, seed=36)
    down = environ | {"BATCHRUN_MAIL": f"smtp://127.0.0.1:{free_port()}", "BATCHRUN_LEASE_S": "0.5"}
    handed = aws_lambda.handle(load_event("schedule.json"), FakeContext(60), environ=down)
    assert handed["continuation"] is True
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 6 and time.monotonic() < deadline:  # past the redrive policy's 5 receives
        got = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=5,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        ).get("Messages", [])
        if not got:
            continue
        seen += 1
        result = aws_lambda.handle(as_sqs_event(got), FakeContext(30), environ=down)
        # Every record a failure: the event source mapping deletes none of them.
        assert len(result["batchItemFailures"]) == len(got), result
    assert seen >= 6, "the kept continuation came back, its delay doubling from a lease"
    dlq = sqs.get_queue_url(QueueName="batchrun-dlq")["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0", "nothing dead-lettered"
    time.sleep(4.5)  # the last keep's delay (at most eight leases)
    drain_as_sqs_events(sqs, queue_url, environ, seconds=60)  # the mail server is back
    assert_one_card_and_one_email_each(mysql_url, smtp_server, want)


def test_a_poison_record_is_dead_lettered_at_once_and_alone(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
    sqs: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    want = sorted(prepare(mysql_url, 600, seed=34))
    event = load_event("sqs_poison.json", USER_1=want[0], USER_2=want[1])
    with caplog.at_level(logging.WARNING, logger="batchrun"):
        result = aws_lambda.handle(event, FakeContext(60), environ=environ)
    # The job it does not know is named in a warning (a Lambda's log shows no info).
    told = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(told) == 1 and "BATCHRUN_JOBS" in told[0], told
    # Poison is never delivered again: on the dead-letter queue now, not left for the
    # redrive policy (up to five more deliveries). A job this function does not know
    # stays on the queue for a function that does.
    failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
    assert failed == {"unknown-job"}
    dlq = sqs.get_queue_url(QueueName="batchrun-dlq")["QueueUrl"]
    dead = sqs.receive_message(
        QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    ).get("Messages", [])
    assert sorted(m["Body"] for m in dead) == sorted(
        r["body"] for r in event["Records"] if r["messageId"] in ("bad-json", "missing-field")
    )
    assert all(m["MessageAttributes"]["reason"]["StringValue"].startswith("poison: ") for m in dead)
    assert smtp_server.sends_per_user() == Counter({want[0]: 1, want[1]: 1})
    assert card_counts(mysql_url, 2025) == {want[0]: 1, want[1]: 1}


def test_an_unknown_event_is_one_clear_error(environ: dict[str, str]) -> None:
    with pytest.raises(BatchrunError, match="unrecognised event"):
        aws_lambda.handle({"hello": "world"}, FakeContext(10), environ=environ)
    with pytest.raises(BatchrunError, match="invalid month"):
        aws_lambda.handle({"job": "birthday", "month": "2025-13"}, FakeContext(10), environ=environ)


def test_odd_events_are_one_clear_error_or_read_as_meant(
    mysql_url: str, environ: dict[str, str]
) -> None:
    """An event that is not an object, a schedule of year 1, records whose attributes are
    not an object, a context that cannot tell its time left, and ``"period": null`` beside
    a month (it ran the current month instead of that one)."""
    prepare(mysql_url, 300, seed=33)
    for event in (None, [], "schedule", 5):
        with pytest.raises(BatchrunError, match="expected a JSON object"):
            aws_lambda.handle(event, FakeContext(10), environ=environ)  # type: ignore[arg-type]
    early = load_event("schedule.json", time="0001-01-01T00:00:00Z")
    with pytest.raises(BatchrunError, match="no usable time"):
        aws_lambda.handle(early, FakeContext(10), environ=environ)
    dry = {"job": "birthday", "period": None, "month": "2025-06", "dry_run": True}
    assert aws_lambda.handle(dry, FakeContext(30), environ=environ)["period"] == "2025-06"
    body = json.dumps({"kind": "nonsense"})
    records = [
        {"messageId": "m1", "receiptHandle": "r1", "body": body, "attributes": None},
        {"messageId": "m2", "receiptHandle": "r2", "body": body, "attributes": ["x"]},
    ]
    answer = aws_lambda.handle({"Records": records}, FakeContext(30), environ=environ)
    assert answer["batchItemFailures"] == [], "poison both, dead-lettered, not a crash"
    # A failed record is named by its id alone: records without one, or sharing one, could
    # only be settled wrongly (they shared the id "" and one disposition).
    for bad, says in (
        ([{"receiptHandle": "r1", "body": body}], "record 1 has no messageId"),
        ([records[0], {**records[1], "messageId": ""}], "record 2 has no messageId"),
        ([records[0], records[0]], "record 2 repeats messageId 'm1'"),
        ([records[0], "m2"], "record 2 is not an object"),
    ):
        with pytest.raises(BatchrunError, match=says):
            aws_lambda.handle({"Records": bad}, FakeContext(30), environ=environ)

    class Mute(FakeContext):
        def get_remaining_time_in_millis(self) -> Any:
            return None

    assert aws_lambda.handle(dry, Mute(), environ=environ)["dry_run"] is True
    # A dry run its deadline cut short says so: its counts are partial (it said nothing).
    cut = aws_lambda.handle(dry, FakeContext(0), environ=environ)
    assert cut["stopped"] is not None and cut["eligible"] == 0, cut


def test_the_database_url_comes_from_secrets_manager(
    mysql_url: str,
    smtp_server: SmtpTestServer,
    environ: dict[str, str],
    moto_server: MotoServer,
) -> None:
    want = prepare(mysql_url, 1200, seed=35)
    parts = urlsplit(mysql_url)
    secrets = aws_client(moto_server, "secretsmanager")
    # the JSON shape RDS writes for a managed secret
    value = {
        "username": parts.username,
        "password": parts.password or "",
        "host": parts.hostname,
        "port": parts.port,
        "dbname": parts.path.lstrip("/"),
    }
    arn = secrets.create_secret(Name="batchrun/db", SecretString=json.dumps(value))["ARN"]
    configured = {k: v for k, v in environ.items() if k != "BATCHRUN_DB"}
    configured["BATCHRUN_DB_SECRET_ARN"] = arn
    result = aws_lambda.handle(
        load_event("on_demand_dry_run.json"), FakeContext(60), environ=configured
    )
    assert result["eligible"] >= len(want)

    configured["BATCHRUN_DB_SECRET_ARN"] = arn.replace("batchrun/db", "nope")
    with pytest.raises(BatchrunError, match="cannot read the database secret") as caught:
        aws_lambda.handle(load_event("on_demand_dry_run.json"), FakeContext(60), environ=configured)
    assert "ResourceNotFoundException" in str(caught.value)

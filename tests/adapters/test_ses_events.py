"""Bounces and complaints from SES (real notification JSON, SNS-wrapped and raw) through a
moto SQS queue, the Lambda's SQS path, and SES sending paused stopping a run (exit 3)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support import EVENTS
from support.aws_server import HOST, MotoServer, aws_client, make_queue_with_dlq
from support.cli import run_cli
from support.db import query
from support.lambda_context import FakeContext
from support.periods import month
from support.ses_events import mailed, mailed_run, sample

from batchrun import aws_lambda
from batchrun.db.store import State, address_key
from batchrun.errors import SendingStoppedError
from batchrun.events import ses as events
from batchrun.mail.message import Message
from batchrun.mail.ses import SesMailer
from batchrun.queue.sqs import SqsQueue

SES = EVENTS / "ses"
JUNE = month(2025, 6)
SES_ID = "0100017fb1a2c3d4-SESID-000000"


# -- the shapes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sns_notification_permanent_bounce", "bounce"),
        ("sns_notification_transient_bounce", "ignored"),
        ("sns_notification_complaint", "complaint"),
        ("sns_event_permanent_bounce", "bounce"),
        ("sns_event_transient_bounce", "ignored"),
        ("sns_event_complaint", "complaint"),
        ("sns_event_delivery", "ignored"),
        ("raw_event_permanent_bounce", "bounce"),
        ("raw_event_transient_bounce", "ignored"),
        ("raw_event_complaint", "complaint"),
        ("raw_event_delivery", "ignored"),
    ],
)
def test_every_ses_shape_is_read(name: str, kind: str) -> None:
    body = sample(name, address="ada@example.com", entity=42)
    assert events.looks_like(body)
    event = events.parse(body)
    assert event.kind == kind
    if kind != "ignored":
        assert event.addresses == ("ada@example.com",)
        assert event.ses_message_id == "0100017fb1a2c3d4-SESID42-000000"
        # X-Batchrun-Id when SES passed the headers on, the Message-ID otherwise
        assert event.entity == events.Entity("birthday", "2025", 42)


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        "[1, 2]",
        '{"hello": "world"}',
        '{"eventType": "Teleport", "mail": {}}',
        '{"notificationType": "Bounce", "bounce": {"bounceType": "Permanent"}}',
        '{"Type": "Notification", "TopicArn": "arn:x", "Message": "not json either"}',
        '{"Type": "Gossip", "TopicArn": "arn:x", "Message": "{}"}',
    ],
)
def test_what_is_no_ses_event_is_poison(body: str) -> None:
    with pytest.raises(events.PoisonEvent):
        events.parse(body)


# -- through a moto SQS queue ---------------------------------------------------------------


async def test_bounces_and_complaints_suppress_transients_do_not_poison_is_dead_lettered(
    db_url: str,
    make_job: Callable[..., Any],
    moto_server: MotoServer,
    aws_env: dict[str, str],
) -> None:
    runtime = await mailed_run(make_job, db_url)
    (a, a_mail), (b, b_mail), (c, c_mail), (d, d_mail) = mailed(db_url)[:4]
    url, dlq = make_queue_with_dlq(moto_server, "ses-events", dlq_name="ses-events-dlq")
    sqs = aws_client(moto_server)
    bodies = [
        sample("sns_notification_permanent_bounce", address=a_mail, entity=a),
        sample("raw_event_complaint", address=b_mail, entity=b),
        sample("sns_event_transient_bounce", address=c_mail, entity=c),
        sample("raw_event_transient_bounce", address=c_mail, entity=c),
        sample("sns_event_delivery", address=d_mail, entity=d),
        "{not json",
        '{"hello": "world"}',
        sample("sns_event_complaint", address=b_mail, entity=b),  # the same complaint again
    ]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    queue = SqsQueue(url, env=aws_env, wait_s=0)
    try:
        summary = await events.drain(queue, runtime.store)
        depth, dead = await queue.depths()
    finally:
        await queue.close()

    assert summary.to_json() | {"duration_s": 0} == {
        "read": 8,
        "bounces": 1,
        "complaints": 2,
        "suppressed": 2,
        "recorded": 2,
        "ignored": 3,
        "poison": 2,
        "failed": 0,
        "duration_s": 0,
    }
    assert (depth, dead) == (0, 2)  # all read; the two poison messages on the DLQ
    dead_bodies = {
        m["Body"] for m in sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
    }
    assert dead_bodies == {"{not json", '{"hello": "world"}'}

    bounced = await runtime.store.suppression(a_mail)
    complained = await runtime.store.suppression(b_mail)
    assert bounced is not None and (bounced.reason, bounced.source) == (
        "bounce",
        f"0100017fb1a2c3d4-SESID{a}-000000",
    )
    assert complained is not None and complained.reason == "complaint"
    assert await runtime.store.suppression(c_mail) is None  # transient: nothing
    assert await runtime.store.suppression(d_mail) is None
    ledger = dict(
        query(
            db_url,
            "SELECT entity_id, mail_event FROM batchrun_ledger WHERE job = 'birthday' "
            "AND period = '2025-06' AND mail_event IS NOT NULL",
        )
    )
    assert ledger == {a: "bounce", b: "complaint"}
    states = dict(
        query(
            db_url, "SELECT entity_id, state FROM batchrun_ledger WHERE entity_id IN (%s, %s)", a, b
        )
    )
    assert set(states.values()) == {int(State.SUCCEEDED)}  # the emails were accepted
    status = await runtime.status("birthday", JUNE, problems=0)
    assert (status["bounces"], status["complaints"]) == (1, 1)


def test_cli_events_drains_the_queue_and_status_counts(
    tmp_path: Path, moto_server: MotoServer, aws_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'b.db'}"
    base = {**aws_env, "BATCHRUN_DB": db, "BATCHRUN_MAIL": f"file://{tmp_path / 'out'}"}
    assert run_cli("db", "migrate", env=base).returncode == 0
    assert run_cli("db", "seed", "--users", "80", env=base).returncode == 0
    ran = run_cli("birthday", "--month", "2025-06", "--json", env=base)
    assert ran.returncode == 0, ran.stderr
    (a, a_mail), (b, b_mail) = mailed(db)[:2]
    url, _ = make_queue_with_dlq(moto_server, "ses-events", dlq_name="ses-events-dlq")
    sqs = aws_client(moto_server)
    for body in (
        sample("sns_event_permanent_bounce", address=a_mail, entity=a),
        sample("sns_notification_transient_bounce", address=b_mail, entity=b),
        "plainly not an event",
    ):
        sqs.send_message(QueueUrl=url, MessageBody=body)

    result = run_cli("events", "--queue", url, "--json", env=base)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["read"], summary["suppressed"], summary["ignored"], summary["poison"]) == (
        3,
        1,
        1,
        1,
    )
    assert "dead-letter queue" in result.stderr
    listed = run_cli("suppress", "list", "--json", env=base)
    assert a_mail in listed.stdout and b_mail not in listed.stdout
    status = json.loads(run_cli("status", "--month", "2025-06", "--json", env=base).stdout)
    assert (status["bounces"], status["complaints"]) == (1, 0)

    missing = run_cli("events", env=base)
    assert missing.returncode == 2 and "--queue" in missing.stderr


# -- the SQS-triggered Lambda ---------------------------------------------------------------


async def test_the_lambda_applies_ses_records_and_keeps_the_poison_from_them(
    sqlite_url: str, make_job: Callable[..., Any], tmp_path: Path
) -> None:
    await mailed_run(make_job, sqlite_url)
    (a, a_mail), (b, b_mail) = mailed(sqlite_url)[:2]
    arn = "arn:aws:sqs:us-east-1:123456789012:batchrun-ses-events"

    def record(n: int, body: str, source: str = arn) -> dict[str, Any]:
        return {
            "messageId": f"m{n}",
            "receiptHandle": f"rh{n}",
            "body": body,
            "attributes": {"ApproximateReceiveCount": "1"},
            "eventSource": "aws:sqs",
            "eventSourceARN": source,
        }

    event = {
        "Records": [
            record(1, sample("sns_event_permanent_bounce", address=a_mail, entity=a)),
            record(2, sample("raw_event_complaint", address=b_mail, entity=b)),
            record(3, "{not json"),
            # an SES event on the retry queue is not applied: a retry message, and poison
            record(4, sample("sns_event_delivery", address=a_mail, entity=a), source="x:retry"),
        ]
    }
    environ = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'out'}",
        "BATCHRUN_EVENTS_QUEUE": "https://sqs.us-east-1.amazonaws.com/123456789012/"
        "batchrun-ses-events",
    }
    # The handler runs its own event loop, as in Lambda: off this test's loop.
    result = await asyncio.to_thread(
        aws_lambda.handle, event, FakeContext(60, "req-events"), environ=environ
    )
    # Poison on the events queue fails (the redrive policy moves it); on the retry queue
    # it is dead-lettered at once, as every poison retry message is.
    assert result == {"batchItemFailures": [{"itemIdentifier": "m3"}]}
    dead = query(sqlite_url, "SELECT body, dead_reason FROM batchrun_queue WHERE dead = 1")
    assert [(body, str(reason).startswith("poison: ")) for body, reason in dead] == [
        (event["Records"][3]["body"], True)
    ]
    rows = dict(query(sqlite_url, "SELECT address, reason FROM batchrun_suppression"))
    assert rows == {address_key(a_mail): "bounce", address_key(b_mail): "complaint"}


# -- SES sending paused ---------------------------------------------------------------------


class SesError(ThreadingHTTPServer):
    """A loopback sesv2 endpoint that answers every SendEmail with one error reply."""

    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__((HOST, 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}"

    def __enter__(self) -> SesError:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    server: SesError

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.requests.append({"path": self.path, **json.loads(body or b"{}")})
        reply = json.dumps({"message": self.server.message}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-amzn-ErrorType", f"{self.server.code}:http://internal.amazon.com/")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


AWS_KEYS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("SendingPausedException", "SES SendingPausedException: Sending paused"),
        ("AccountSuspendedException", "SES AccountSuspendedException"),
    ],
)
async def test_a_paused_account_is_a_stop_and_the_configuration_set_is_sent(
    code: str, words: str
) -> None:
    with SesError(code, "Sending paused for this account.") as server:
        mailer = SesMailer(
            "us-east-1",
            env={
                **AWS_KEYS,
                "AWS_ENDPOINT_URL_SESV2": server.endpoint,
                "BATCHRUN_SES_CONFIGURATION_SET": "batchrun-events",
            },
        )
        message = Message(
            sender="birthday@example.com",
            to_addr="ada@example.com",
            to_name="",
            subject="Hi",
            text="Hello",
            html="",
            message_id="<birthday.2025.1@example.com>",
        )
        try:
            with pytest.raises(SendingStoppedError, match=words):
                await mailer.send(message)
        finally:
            await mailer.close()
    assert [r["ConfigurationSetName"] for r in server.requests] == ["batchrun-events"]


def test_sending_paused_stops_the_run_queues_the_rest_and_exits_3(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'b.db'}"
    base = {"BATCHRUN_DB": db, "BATCHRUN_FROM": "birthday@example.com", **AWS_KEYS}
    assert run_cli("db", "migrate", env=base).returncode == 0
    assert run_cli("db", "seed", "--users", "400", env=base).returncode == 0
    with SesError("SendingPausedException", "Sending paused for this account.") as server:
        env = {
            **base,
            "BATCHRUN_MAIL": "ses://us-east-1",
            "AWS_ENDPOINT_URL_SESV2": server.endpoint,
        }
        result = run_cli("birthday", "--month", "2025-06", "--concurrency", "2", "--json", env=env)
    assert result.returncode == 3, result.stderr
    summary = json.loads(result.stdout)
    assert summary["emails_sent"] == 0
    assert summary["eligible"] > 10
    # Stopped at the first refusal (two in flight), not after the breaker's five.
    assert 1 <= len(server.requests) <= 2, len(server.requests)
    assert summary["stopped"].startswith("SES SendingPausedException: Sending paused")
    assert "SES SendingPausedException: Sending paused" in " ".join(result.stderr.split())
    states = query(
        db,
        "SELECT state, queued, last_error FROM batchrun_ledger WHERE period = '2025-06'",
    )
    assert states and all(s == int(State.RETRYING) and q == 1 for s, q, _ in states)
    assert all(
        str(e).startswith("SES SendingPausedException: Sending paused") for _, _, e in states
    )
    assert summary["queued_for_retry"] == len(states) == summary["failed"]
    kinds = [json.loads(b)["kind"] for (b,) in query(db, "SELECT body FROM batchrun_queue")]
    # one retry per entity; a continuation for the rest of the month, as an open breaker hands on
    assert kinds.count("retry") == len(states)
    assert set(kinds) <= {"retry", "continuation"}

"""Fault injection: crashes anywhere, a killed database connection, a mail server
that dies or hangs, an unreachable retry queue, poison messages and hostile data.

Everything is real: MariaDB (and SQLite files), the aiosmtpd server of ``smtp_server.py``,
moto's server. batchrun runs as ``python -m batchrun`` subprocesses, as in production, so
SIGKILL and exit codes are the real ones. Random choices come from ``random.Random(seed)``
and every assertion message names the seed and the iteration, so a failure reproduces
(``BATCHRUN_TEST_SEED=N`` replays another seed). The long variants are in ``test_soak.py``.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pymysql
import pytest
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.birthday import (
    birthday_scope,
    card_codes,
    card_counts,
    eligible_ids,
    ledger_states,
    seed_users,
    user_of,
    want_ids,
)
from support.birthday import status_of as status_of_rt
from support.checks import assert_month_complete, assert_one_card_each
from support.cli import SENDER, cli_env, cli_seed_users, run_cli, spawn, summary_of, wait_until
from support.crash import CONCURRENCY, TEMPORARY, crash_anywhere, month_status
from support.db import mysql_connect, query
from support.periods import month
from support.smtp_server import SmtpTestServer

from batchrun import aws_lambda
from batchrun.db import Store
from batchrun.db.store import State
from batchrun.job import Context
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import MAX_NAME_CHARS
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.period import Unit
from batchrun.queue.base import QueueMessage
from batchrun.queue.base import from_url as queue_from_url
from batchrun.runtime import Options, Runtime
from batchrun.settings import Settings

UNITS: dict[str, Unit] = {"birthday": "month"}  # jobs a consumer parses bodies for

SEED = int(os.environ.get("BATCHRUN_TEST_SEED", "20250607"))


# -- helpers -------------------------------------------------------------------------------


def display_name(raw: bytes) -> str:
    """The To header's one display name, parsed the way a mail client reads it.

    RFC 2047 §6.2: the fold between two encoded words is not text (clients drop it);
    Python 3.11's parser keeps it as a space (CPython gh-128110), so it is taken out first.
    """
    head, sep, body = raw.partition(b"\r\n\r\n")
    raw = re.sub(rb"\?=\r\n =\?", b"?==?", head) + sep + body
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    (address,) = parsed["To"].addresses
    return str(address.display_name)


# -- 1. crash anywhere ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_crash_anywhere_then_a_rerun_completes_the_month_once(
    db_url: str, smtp_server: SmtpTestServer
) -> None:
    report = crash_anywhere(db_url, smtp_server, seed=SEED, iterations=20)
    print(f"crash anywhere ({db_url.split(':')[0]}): {asdict(report)}")
    assert report.iterations == 20
    assert report.eligible > 150, "a month of a few hundred users"
    # Not vacuous: many kills must land while emails were going out.
    assert report.mid_month >= 5, asdict(report)


class SlowCards(Birthday):
    """A job whose card inserts take half a second: a database under load."""

    async def prepare(self, ctx: Context, rows: list[dict[str, Any]]) -> None:
        await asyncio.sleep(0.5)
        await super().prepare(ctx, rows)


async def test_a_dead_runs_claims_expiring_while_a_page_is_prepared_are_still_done(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_settings: Callable[..., Settings],
) -> None:
    await seed_users(store, 600, seed=14)
    want = want_ids(db_url)
    held = sorted(want)[:10]
    # A run that died holding ten users; their lease runs out 0.2 s from now, while the
    # next run is creating the page's cards.
    await store.claim(birthday_scope(2025, 6), ids=held, new_ids=held, me="f" * 32, lease_ms=200)
    settings = make_settings(db_url, mail_url=smtp_server.url)
    mailer = mailer_from_url(smtp_server.url, timeout=2.0)
    queue = queue_from_url(None, db=store.db, max_receives=5)
    try:
        summary = await Runtime(SlowCards(), store, mailer, queue, settings).run(
            month(2025, 6), Options(concurrency=10)
        )
    finally:
        await mailer.close()
    assert smtp_server.sends_per_user(2025) == Counter(dict.fromkeys(want, 1)), summary
    rt = Runtime(Birthday(), store, None, None, settings)
    assert (await status_of_rt(rt, month(2025, 6))).pending == 0


# -- 2. the database connection killed mid-run ---------------------------------------------


def kill_connections(admin: pymysql.connections.Connection[Any], database: str) -> int:
    """KILL every connection to ``database`` but the killer's own; return how many."""
    with admin.cursor() as cur:
        cur.execute(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()",
            (database,),
        )
        ids = [int(r[0]) for r in cur.fetchall()]
        killed = 0
        for thread in ids:
            try:
                cur.execute("KILL %s", (thread,))
                killed += 1
            except pymysql.err.OperationalError:
                pass  # it ended meanwhile (1094 Unknown thread id)
    return killed


def assert_one_clear_line(result_code: int, stderr: str, where: str) -> None:
    """Exit 1 is allowed only with one clear ``error:`` line and no traceback."""
    if result_code == 1:
        lines = [line for line in stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1, f"{where}: {stderr}"
        assert "Traceback" not in stderr, f"{where}: {stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["once", "repeatedly"])
def test_database_connections_killed_mid_run(
    mysql_url: str, smtp_server: SmtpTestServer, pattern: str
) -> None:
    database = urlsplit(mysql_url).path.lstrip("/")
    env = cli_env(mysql_url, smtp_server.url)
    cli_seed_users(mysql_url, env, 3000, seed=31)
    want = want_ids(mysql_url)
    eligible = eligible_ids(mysql_url, 6)
    smtp_server.set_latency(0.01)
    run = spawn("birthday", "--month", "2025-06", "--concurrency", str(CONCURRENCY), env=env)
    admin = mysql_connect()
    killed = 0
    try:
        assert wait_until(lambda: len(smtp_server.messages) >= len(want) // 4, timeout=60)
        killed += kill_connections(admin, database)
        if pattern == "repeatedly":
            until = time.monotonic() + 1.5
            while time.monotonic() < until and run.poll() is None:
                time.sleep(0.05)
                killed += kill_connections(admin, database)
        _, err = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        admin.close()
    assert killed >= 1, "the run's connections were found in the processlist"
    where = f"pattern={pattern} killed={killed}"
    print(f"connections killed {pattern}: {killed} kills, exit {run.returncode}: {err.strip()}")
    assert run.returncode in (0, 1), f"{where}: exit {run.returncode}: {err}"
    assert_one_clear_line(run.returncode, err, where)
    if run.returncode == 1:
        assert "database" in err.lower(), err

    smtp_server.set_latency(0)
    rerun = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
    assert rerun.returncode == 0, f"{where}: {rerun.stderr}"
    assert_month_complete(
        mysql_url,
        smtp_server,
        year=2025,
        want=want,
        skipped=len(eligible - want),
        max_duplicates=CONCURRENCY,
        where=where,
    )
    status = month_status(env, "2025-06")
    assert (status["pending"], status["retry_queue_depth"]) == (0, 0), status


@pytest.mark.slow
def test_database_connections_killed_during_a_retry_drain(
    mysql_url: str, smtp_server: SmtpTestServer
) -> None:
    database = urlsplit(mysql_url).path.lstrip("/")
    env = cli_env(mysql_url, smtp_server.url)
    cli_seed_users(mysql_url, env, 3000, seed=32)
    want = want_ids(mysql_url)
    eligible = eligible_ids(mysql_url, 6)
    emails = dict(query(mysql_url, "SELECT email, id FROM user WHERE birth_month = 6"))
    failing = {e for e, uid in emails.items() if uid in want and uid % 3 == 0}
    smtp_server.set_policy(lambda rcpt, _n: TEMPORARY if rcpt in failing else None)
    first = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert first.returncode == 3, first.stderr
    assert summary_of(first)["queued_for_retry"] == len(failing)

    smtp_server.set_policy(None)
    smtp_server.set_latency(0.01)
    admin = mysql_connect()
    before = len(smtp_server.messages)
    drain = spawn("retry", "--concurrency", "5", "--json", env=env, stdout=subprocess.PIPE)
    try:
        assert wait_until(
            lambda: len(smtp_server.messages) - before >= len(failing) // 4, timeout=60
        )
        killed = kill_connections(admin, database)
        _, err = drain.communicate(timeout=90)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
        admin.close()
    assert killed >= 1
    assert drain.returncode in (0, 1, 3), err
    assert_one_clear_line(drain.returncode, err, "retry")

    # Messages the killed drain had received stay invisible for their visibility timeout:
    # the next `birthday` run finishes those users, and a later drain deletes the messages.
    smtp_server.set_latency(0)
    rerun = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert_month_complete(
        mysql_url,
        smtp_server,
        year=2025,
        want=want,
        skipped=len(eligible - want),
        max_duplicates=5,
        where="retry drain killed",
    )


# -- 3. the mail server dies or hangs --------------------------------------------------------


@pytest.fixture
def make_smtp_server() -> Iterator[Callable[..., SmtpTestServer]]:
    """Factory for servers a test may stop (the session's server must stay up)."""
    servers: list[SmtpTestServer] = []

    def make(**kwargs: Any) -> SmtpTestServer:
        server = SmtpTestServer(**kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["dies", "hangs", "hangs-on-connect"])
def test_mail_server_dies_or_hangs_mid_run(
    db_url: str, make_smtp_server: Callable[..., SmtpTestServer], fault: str
) -> None:
    server = make_smtp_server(latency=0.03)  # ~170 emails/s: the fault lands mid-month
    concurrency = 5
    # The bound comes from the environment for a hang while sending, from the URL's own
    # ?timeout= when connecting hangs: both knobs must bound the hang.
    if fault == "hangs-on-connect":
        env = cli_env(db_url, f"{server.url}?timeout=1")
    else:
        env = cli_env(db_url, server.url, BATCHRUN_MAIL_TIMEOUT_S="1")
    cli_seed_users(db_url, env, 3000, seed=33)
    want = want_ids(db_url)
    eligible = eligible_ids(db_url, 6)
    started = time.monotonic()
    run = spawn(
        "birthday", "--month", "2025-06", "--concurrency", str(concurrency), "--json",
        env=env, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert wait_until(lambda: len(server.messages) >= len(want) // 4, timeout=60)
        if fault == "dies":
            server.stop()  # connections dropped, the port refuses from now on
        elif fault == "hangs":
            server.set_latency(60)  # accepts DATA, never answers in time
        else:
            server.set_latency(0, connect=60)  # greets, then never answers EHLO
            server.drop_connections()  # every send must connect again
        out, err = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    elapsed = time.monotonic() - started
    delivered = server.sends_per_user()
    assert run.returncode == 3, f"{fault}: exit {run.returncode}: {err}"
    assert elapsed < 45, f"{fault}: the run must not grind through one timeout per user"
    summary = json.loads(out)
    assert summary["stopped"] and "mail" in summary["stopped"], summary
    # A server that kills or drops its connections between recording a message and
    # replying 250 holds it while the client saw a failure: at most one per connection.
    # A server that hangs with connections open (hangs) never records what it hangs on.
    assert summary["emails_sent"] <= sum(delivered.values()) < len(want), summary
    assert sum(delivered.values()) <= summary["emails_sent"] + concurrency, summary
    if fault == "hangs":
        assert summary["emails_sent"] == sum(delivered.values()), "a hung send never lands"
    assert summary["failed"] == summary["queued_for_retry"] > 0, summary
    assert summary["continuation"] or summary["emails_sent"] + summary["failed"] == len(want)
    status = month_status(env, "2025-06")
    assert status["emails_sent"] == summary["emails_sent"]
    assert status["retry_queue_depth"] >= 1, "the failures (and the rest of the month) wait"

    healthy = server if fault != "dies" else make_smtp_server()
    healthy.reset()
    retry_env = cli_env(db_url, healthy.url, BATCHRUN_MAIL_TIMEOUT_S="1")
    retry = run_cli("retry", "--json", env=retry_env, timeout=120)
    assert retry.returncode == 0, retry.stderr
    assert summary_of(retry)["remaining"] == 0
    after = healthy.sends_per_user()
    per_user = delivered + after
    assert set(per_user) == want, f"{fault}: nothing lost"
    assert sum(n - 1 for n in per_user.values()) <= concurrency, f"{fault}: {per_user}"
    assert_one_card_each(db_url, want)
    assert ledger_states(db_url, 2025) == Counter(
        {int(State.SUCCEEDED): len(want), int(State.SKIPPED): len(eligible - want)}
    )
    status = month_status(retry_env, "2025-06")
    assert (status["pending"], status["retrying"], status["retry_queue_depth"]) == (0, 0, 0)


# -- 4. the retry queue unreachable ----------------------------------------------------------


def make_sqs_queues(server: MotoServer) -> str:
    """A retry queue with a dead-letter queue (maxReceiveCount 5); returns its URL."""
    return make_queue_with_dlq(server)[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("next_run", ["birthday", "retry"])
def test_retry_queue_unreachable_keeps_failures_in_the_ledger(
    mysql_url: str, smtp_server: SmtpTestServer, next_run: str
) -> None:
    moto = MotoServer().start()
    moto.reset()  # moto's state lives in this process: earlier tests' queues would clash
    try:
        queue_url = make_sqs_queues(moto)
        env = cli_env(mysql_url, smtp_server.url, BATCHRUN_RETRY_QUEUE=queue_url, **moto.env)
        cli_seed_users(mysql_url, env, 3000, seed=34)
        want = want_ids(mysql_url)
        eligible = eligible_ids(mysql_url, 6)
        ordered = sorted(want)
        # Four failures in the later half of the month, so they come after the queue died
        # (each costs the run a few seconds of SQS client retries while the queue is down).
        late = ordered[len(ordered) // 2 :]
        chosen = set(late[:: len(late) // 4][:4])
        emails = dict(query(mysql_url, "SELECT email, id FROM user WHERE birth_month = 6"))
        failing = {e for e, uid in emails.items() if uid in chosen}
        smtp_server.set_policy(lambda rcpt, _n: TEMPORARY if rcpt in failing else None)
        smtp_server.set_latency(0.02)
        run = spawn(
            "birthday", "--month", "2025-06", "--concurrency", "2", "--json",
            env=env, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert wait_until(lambda: len(smtp_server.messages) >= 1, timeout=60)
            moto.stop()  # the queue is gone after the run opened it
            out, err = run.communicate(timeout=180)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
        assert run.returncode == 3, err
        summary = json.loads(out)
        assert summary["failed"] == len(failing)
        assert summary["not_queued"] > 0, summary
        assert summary["not_queued"] + summary["queued_for_retry"] == len(failing)
        assert "retry queue unreachable" in err
        task = query(
            mysql_url,
            "SELECT COUNT(*) FROM batchrun_ledger WHERE once_key = '2025' AND state = %s "
            "AND queued = 0",
            int(State.RETRYING),
        )
        assert task == [(summary["not_queued"],)], "the failures stay in the ledger"

        moto.start()  # the queue is back (moto keeps its state in this process)
        smtp_server.set_policy(None)
        smtp_server.set_latency(0)
        if next_run == "birthday":
            again = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
            assert again.returncode == 0, again.stderr
            assert summary_of(again)["emails_sent"] == len(failing)
        drain = run_cli("retry", "--json", env=env, timeout=120)
        assert drain.returncode == 0, drain.stderr
        result = summary_of(drain)
        assert result["remaining"] == 0, result
        if next_run == "retry":
            assert result["requeued"] == summary["not_queued"]
            assert result["succeeded"] == len(failing)
        assert_month_complete(
            mysql_url,
            smtp_server,
            year=2025,
            want=want,
            skipped=len(eligible - want),
            max_duplicates=0,
            where=f"queue down, then {next_run}",
        )
        status = month_status(env, "2025-06")
        assert (status["pending"], status["retry_queue_depth"], status["dead_letter_depth"]) == (
            0,
            0,
            0,
        )
    finally:
        moto.stop()


# -- 5. poison messages ------------------------------------------------------------------------


def _retry(**fields: Any) -> str:
    body = {"v": 1, "kind": "retry", "job": "birthday", "month": "2025-06", "user_id": 1}
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not ...})


POISON: dict[str, str] = {
    "not JSON": "{not json",
    "empty": "",
    "a JSON array": "[1, 2, 3]",
    "JSON null": "null",
    "a JSON string": '"retry"',
    # A well-formed job this process does not know is no poison: it stays on the queue
    # (test_queue_faults.py). A job name no job can have is.
    "job not a name": _retry(job="../Payroll"),
    "job not a string": _retry(job=["birthday"]),
    "unknown kind": _retry(kind="explode"),
    "no kind": _retry(kind=...),
    "no user_id": _retry(user_id=...),
    "user_id a string": _retry(user_id="42"),
    "user_id a float": _retry(user_id=42.0),
    "user_id a bool": _retry(user_id=True),
    "user_id negative": _retry(user_id=-5),
    "user_id zero": _retry(user_id=0),
    "user_id beyond BIGINT": _retry(user_id=2**70),
    "user_id NaN": _retry(user_id=1).replace('"user_id": 1', '"user_id": NaN'),
    "user_id of 5000 digits": _retry(user_id=1).replace('"user_id": 1', '"user_id": ' + "9" * 5000),
    "attempt a string": _retry(attempt="1"),
    "no month": _retry(month=...),
    "month 13": _retry(month="2025-13"),
    "month a number": _retry(month=202506),
    "continuation without after_id": json.dumps(
        {"kind": "continuation", "job": "birthday", "month": "2025-06"}
    ),
    "shard with an empty range": json.dumps(
        {"kind": "shard", "job": "birthday", "month": "2025-06", "after_id": 9, "until_id": 9}
    ),
    "control characters": "\x00\x01\x02\x7f\x1b[2J",
    "a huge body (100 KiB)": _retry(reason="x" * 100_000),
}
# Python's json recursion limit: a 4 KiB body of brackets is not JSON batchrun can parse.
NESTED = "[" * 5000 + "]" * 5000


def _queue_rows(db_url: str) -> list[tuple[Any, ...]]:
    return query(db_url, "SELECT id, body, dead, dead_reason FROM batchrun_queue ORDER BY id")


def _put_on_local_queue(db_url: str, bodies: list[str]) -> None:
    now = int(time.time() * 1000)
    for body in bodies:
        query(
            db_url,
            "INSERT INTO batchrun_queue (body, visible_at, receive_count, dead, created_at) "
            "VALUES (%s, %s, 0, 0, %s)",
            body,
            now,
            now,
        )


@pytest.mark.slow
def test_poison_messages_are_dead_lettered_with_the_reason_logged(
    db_url: str, smtp_server: SmtpTestServer
) -> None:
    env = cli_env(db_url, smtp_server.url)
    # PostgreSQL text cannot hold a NUL at all (batchrun's own JSON bodies escape it).
    nul = "\ufffd" if db_url.startswith("postgres") else "\x00"
    poison = {label: body.replace("\x00", nul) for label, body in POISON.items()}
    cli_seed_users(db_url, env, 1000, seed=35)
    want = want_ids(db_url)
    victim = min(want)
    (email,) = query(db_url, "SELECT email FROM user WHERE id = %s", victim)[0]
    smtp_server.set_policy(lambda rcpt, _n: TEMPORARY if rcpt == email else None)
    first = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert first.returncode == 3, first.stderr
    smtp_server.set_policy(None)
    _put_on_local_queue(db_url, list(poison.values()))  # around the one real retry

    drain = run_cli("retry", "--json", env=env, timeout=60)
    assert drain.returncode == 0, f"the consumer must not crash: {drain.stderr}"
    assert "Traceback" not in drain.stderr
    result = summary_of(drain)
    assert result["processed"] == len(poison) + 1, result
    assert (result["dead_lettered"], result["succeeded"], result["remaining"]) == (
        len(poison),
        1,
        0,
    )
    logged = [line for line in drain.stderr.splitlines() if "poison message" in line]
    assert len(logged) == len(poison), drain.stderr
    assert all(len(line) < 1000 for line in logged), "a huge body is not dumped into the log"
    dead = {body: reason for _, body, is_dead, reason in _queue_rows(db_url) if is_dead}
    assert set(dead) == set(poison.values()), "each poison body kept, as it was, in the DLQ"
    for label, body in poison.items():
        assert str(dead[body]).startswith("poison: "), (label, dead[body])
    status = month_status(env, "2025-06")
    assert (status["dead_letter_depth"], status["pending"]) == (len(poison), 0)
    assert smtp_server.sends_per_user(2025)[victim] == 1

    again = run_cli("retry", "--json", env=env)
    assert again.returncode == 0 and summary_of(again)["processed"] == 0, "never retried"


@pytest.mark.slow
def test_poison_messages_on_sqs_go_to_the_dead_letter_queue(
    mysql_url: str, smtp_server: SmtpTestServer, moto_server: MotoServer
) -> None:
    moto_server.reset()
    queue_url = make_sqs_queues(moto_server)
    env = cli_env(mysql_url, smtp_server.url, BATCHRUN_RETRY_QUEUE=queue_url, **moto_server.env)
    cli_seed_users(mysql_url, env, 300, seed=36)
    sqs = aws_client(moto_server)
    bodies = {label: body for label, body in POISON.items() if body}  # SQS refuses empty ones
    bodies["a 200 KiB body"] = _retry(reason="y" * 200_000)
    bodies["control characters"] = "\x09\x0a\x0d only the ones SQS allows"
    for body in bodies.values():
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)

    drain = run_cli("retry", "--json", env=env, timeout=90)
    assert drain.returncode == 0, drain.stderr
    assert "Traceback" not in drain.stderr
    result = summary_of(drain)
    assert (result["processed"], result["dead_lettered"], result["remaining"]) == (
        len(bodies),
        len(bodies),
        0,
    )
    dlq = sqs.get_queue_url(QueueName="batchrun-dlq")["QueueUrl"]
    landed: dict[str, str] = {}
    while True:
        got = sqs.receive_message(
            QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        ).get("Messages", [])
        if not got:
            break
        for message in got:
            landed[message["Body"]] = message["MessageAttributes"]["reason"]["StringValue"]
            sqs.delete_message(QueueUrl=dlq, ReceiptHandle=message["ReceiptHandle"])
    assert set(landed) == set(bodies.values())
    assert all(reason.startswith("poison: ") for reason in landed.values()), landed.values()
    assert month_status(env, "2025-06")["retry_queue_depth"] == 0


class _Context:
    aws_request_id = "poison-1"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _sqs_record(index: int, body: str) -> dict[str, Any]:
    return {
        "messageId": f"m-{index}",
        "receiptHandle": f"r-{index}",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1"},
        "eventSource": "aws:sqs",
    }


def test_poison_records_are_dead_lettered_alone_in_a_lambda_batch(
    tmp_path: Path, sqlite_url: str
) -> None:
    environ = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_FROM": SENDER,
    }
    assert run_cli("db", "migrate", env=environ).returncode == 0
    assert run_cli("db", "seed", "--users", "200", "--seed", "37", env=environ).returncode == 0
    good = min(want_ids(sqlite_url))
    bodies = list(POISON.values())
    valid = QueueMessage("retry", "birthday", "2025-06", entity_id=good, attempt=1).to_json()
    records = [_sqs_record(i, b) for i, b in enumerate(bodies)] + [_sqs_record(len(bodies), valid)]
    result = aws_lambda.handle({"Records": records}, _Context(), environ=environ)
    assert result["batchItemFailures"] == [], "poison is dead-lettered, not delivered again"
    dead = [(row[1], row[3]) for row in _queue_rows(sqlite_url) if row[2]]
    assert sorted(body for body, _ in dead) == sorted(bodies), "each poison alone, with its reason"
    assert all(reason.startswith("poison: ") for _, reason in dead), dead
    assert card_counts(sqlite_url, 2025) == {good: 1}


def test_a_deeply_nested_json_body_is_poison_not_a_crash(db_url: str, tmp_path: Path) -> None:
    env = cli_env(db_url, f"file://{tmp_path / 'outbox'}")
    assert run_cli("db", "migrate", env=env).returncode == 0
    _put_on_local_queue(db_url, [NESTED, _retry(kind="explode")])
    drain = run_cli("retry", "--json", env=env)
    assert drain.returncode == 0, drain.stderr
    assert summary_of(drain)["dead_lettered"] == 2
    assert [row[2] for row in _queue_rows(db_url)] == [1, 1]
    # The dead letters are listed, the nested one too (it stopped `dead list` with a
    # RecursionError, exit 1, leaving only `dead purge`).
    listed = run_cli("dead", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 2
    # Into a pipe: plain columns, a line a letter, nothing cut (it drew rich's box there,
    # cut to COLUMNS, the reason wrapped over lines).
    plain = run_cli("dead", "list", env=env | {"COLUMNS": "40"})
    lines = plain.stdout.splitlines()
    assert lines[0].split() == [
        "id",
        "job",
        "period",
        "entity",
        "receives",
        "queued",
        "at",
        "reason",
    ]
    assert len(lines) == 3 and not any(c in plain.stdout for c in "┃━│"), plain.stdout


def test_a_deeply_nested_record_is_dead_lettered_in_a_lambda_batch(
    tmp_path: Path, sqlite_url: str
) -> None:
    environ = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_FROM": SENDER,
    }
    assert run_cli("db", "migrate", env=environ).returncode == 0
    records = [_sqs_record(0, NESTED), _sqs_record(1, _retry(kind="explode"))]
    result = aws_lambda.handle({"Records": records}, _Context(), environ=environ)
    assert result["batchItemFailures"] == []
    assert [(row[1], row[2]) for row in _queue_rows(sqlite_url)] == [
        (NESTED, 1),
        (_retry(kind="explode"), 1),
    ]


# -- 6. hostile and odd data ---------------------------------------------------------------------

LONG_NAME = "Ä" + "x" * 9_998 + "Z"  # 10,000 characters
# label -> (first_name, last_name, email, date_of_birth); every one valid, born in June.
ODD_USERS: dict[str, tuple[str | None, str | None, str, str]] = {
    "null names": (None, None, "nonames@example.com", "1990-06-01"),
    "10,000-character names": (LONG_NAME, LONG_NAME, "long@example.com", "1980-06-02"),
    "CR/LF in name": (
        "Eve\r\nBcc: evil@attacker.example",
        "X\nY",
        "crlf@example.com",
        "1985-06-03",
    ),
    "unicode names": ("Zoë 李 🎂", "O'Brien-שלום\u200b", "uni@example.com", "1991-06-04"),
    "markup in name": ("<script>alert(1)</script>", "&amp;", "html@example.com", "1992-06-05"),
    "shared address 1": ("Ann", "Shared", "family@example.com", "1970-06-06"),
    "shared address 2": ("Ben", "Shared", "family@example.com", "1972-06-07"),
    "non-ASCII address": ("José", "Ünï", "josé@exämple.com", "1993-06-08"),
}
INVALID_ADDRESSES = [
    "bob@",
    "no-at-sign",
    "",
    " lead@example.com",
    "two@@example.com",
    "a@b@example.com",
    "eve@example.com\r\nBcc: evil@attacker.example",
    "Eve <eve@example.com>",
    "x" * 250 + "@example.com",
]


def _insert_user(
    db_url: str, first: str | None, last: str | None, email: str | None, born: str, status: int = 10
) -> int:
    query(
        db_url,
        "INSERT INTO user (first_name, last_name, email, date_of_birth, status) "
        "VALUES (%s, %s, %s, %s, %s)",
        first,
        last,
        email,
        born,
        status,
    )
    rows = query(db_url, "SELECT MAX(id) FROM user")
    return int(rows[0][0])


@pytest.mark.slow
def test_hostile_and_odd_user_data_is_handled_counted_and_reported(
    db_url: str, smtp_server: SmtpTestServer
) -> None:
    env = cli_env(db_url, smtp_server.url)
    assert run_cli("db", "migrate", env=env).returncode == 0
    if db_url.startswith("mysql"):
        # The migration's own user table caps names at 255 characters; applications' may not.
        query(
            db_url,
            "ALTER TABLE user MODIFY first_name TEXT NULL, MODIFY last_name TEXT NULL, "
            "MODIFY email VARCHAR(1000) NULL",
        )
    if db_url.startswith("postgres"):
        query(
            db_url,
            "ALTER TABLE user ALTER first_name TYPE TEXT, ALTER last_name TYPE TEXT, "
            "ALTER email TYPE VARCHAR(1000)",
        )
    users = {label: _insert_user(db_url, *row) for label, row in ODD_USERS.items()}
    invalid = [
        _insert_user(db_url, "Bad", str(i), address, "1990-06-09")
        for i, address in enumerate(INVALID_ADDRESSES)
    ]
    _insert_user(db_url, "No", "Address", None, "1990-06-10")  # never selected
    _insert_user(db_url, "In", "Active", "inactive@example.com", "1990-06-11", status=0)

    run = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert run.returncode == 0, run.stderr
    summary = summary_of(run)
    mailed = set(users.values()) - {users["non-ASCII address"]}
    assert summary["eligible"] == len(users) + len(invalid)
    assert summary["skipped"] == len(invalid), "invalid addresses: counted as skipped"
    # The test server has no SMTPUTF8: a non-ASCII address is a permanent failure, recorded.
    assert (summary["failed"], summary["dead_lettered"]) == (1, 1), summary
    assert summary["emails_sent"] == summary["cards_created"] - 1 == len(mailed)
    assert card_counts(db_url, 2025) == dict.fromkeys(set(users.values()), 1)

    by_user = {user_of(m.message_id)[1]: m for m in smtp_server.messages}
    assert set(by_user) == mailed
    emails = dict(query(db_url, "SELECT id, email FROM user"))
    headers = {"From", "To", "Subject", "Date", "Message-ID", "X-Batchrun-Id", "Auto-Submitted"}
    headers |= {"MIME-Version", "Content-Type"}
    for uid, message in by_user.items():
        assert message.recipients == [emails[uid]], "one envelope recipient: the user"
        assert set(message.email.keys()) == headers, sorted(message.email.keys())
        (to,) = message.email["To"].addresses
        assert to.addr_spec == emails[uid]
        name = display_name(message.raw)
        assert len(name) <= MAX_NAME_CHARS
        assert not any(c in name for c in "\r\n\x00")
        html_part = message.email.get_body(("html",))
        assert html_part is not None and "<script>" not in html_part.get_content()
    long_name = display_name(by_user[users["10,000-character names"]].raw)
    assert long_name == LONG_NAME[:MAX_NAME_CHARS], "capped at 200 characters"
    plain = by_user[users["null names"]].email.get_body(("plain",))
    assert plain is not None and "Happy birthday, there!" in plain.get_content()
    assert by_user[users["shared address 1"]].recipients == ["family@example.com"]
    assert by_user[users["shared address 2"]].recipients == ["family@example.com"]
    codes = card_codes(db_url, 2025)
    assert codes[users["shared address 1"]] != codes[users["shared address 2"]]

    status = month_status(env, "2025-06")
    assert (status["skipped"], status["failed_permanent"], status["pending"]) == (
        len(invalid),
        1,
        0,
    )
    problems = {p["user_id"]: p for p in status["problems"]}
    assert set(problems) == {*invalid, users["non-ASCII address"]}
    assert all(problems[uid]["reason"] == "invalid email address" for uid in invalid)
    assert problems[users["non-ASCII address"]]["state"] == "failed"


@pytest.mark.parametrize("year", [2025, 2100])  # two non-leap years, one a century
def test_a_birthday_on_29_february_in_a_non_leap_year(
    db_url: str, smtp_server: SmtpTestServer, year: int
) -> None:
    env = cli_env(db_url, smtp_server.url)
    assert run_cli("db", "migrate", env=env).returncode == 0
    leapling = _insert_user(db_url, "Leap", "Ling", "leap@example.com", "2004-02-29")
    other = _insert_user(db_url, "Feb", "First", "feb@example.com", "2001-02-01")
    run = run_cli("birthday", "--month", f"{year}-02", "--json", env=env)
    assert run.returncode == 0, run.stderr
    summary = summary_of(run)
    assert (summary["eligible"], summary["emails_sent"]) == (2, 2)
    assert smtp_server.sends_per_user(year) == Counter({leapling: 1, other: 1})
    (scheduled,) = query(
        db_url,
        "SELECT scheduled_at FROM gift_card WHERE idempotency_key = %s",
        f"birthday:{year}:{leapling}",
    )[0]
    assert str(scheduled).startswith(f"{year}-02-01"), scheduled

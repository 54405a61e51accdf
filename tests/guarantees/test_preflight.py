"""Checks before any effect, a failing tiny run that ends at once, one retry message per
entity, and a migrate that leaves nothing half made.

A broken setup (an outbox that is a file or cannot be written, an SQS queue that does not
exist) is found before the run claims, creates or queues anything: exit 1 and the cause in
one stderr line. A mail backend that does not answer (an SMTP server nobody runs, an SES
endpoint that is down) is an outage: the run claims nothing, hands the period on to the
retry queue as one continuation, says why in one line and exits 3; `batchrun retry` does
the period once the server answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from support.aws_server import MotoServer, answer_with, aws_client
from support.birthday import migrate_and_seed_demo, seed_users, want_ids
from support.checks import assert_one_card_and_one_email_each
from support.cli import run_cli
from support.db import query
from support.periods import month
from support.ports import free_port
from support.smtp_server import SmtpTestServer
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.db import Store
from batchrun.errors import MailConnectionError, MailUnreachableError, QueueError
from batchrun.mail.file import FileMailer
from batchrun.mail.ses import SesMailer
from batchrun.mail.smtp import SmtpMailer
from batchrun.queue.sqs import SqsQueue
from batchrun.runtime import Options, Runtime

MONTH = "2025-06"
JUNE = month(2025, 6)
SENDER = "birthday@example.com"
PASSWORD = "pre-flight-S3CRET"
CLOSING = "421 4.3.2 Service shutting down"  # connection-level: feeds the breaker
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What DESIGN.md promises every --json summary of a month job holds.
DESIGN_KEYS = (
    "job", "month", "dry_run", "eligible", "cards_created", "emails_sent", "failed",
    "queued_for_retry", "duration_s",
)  # fmt: skip
MAIL_DOWN = ("smtp refused", "ses unreachable")  # outages: exit 3, the period handed on


def invoke(*args: str, env: dict[str, str]) -> Result:
    """The CLI in-process, with ``env`` over the environment minus BATCHRUN_*."""
    full: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    full.update({"COLUMNS": "400", "NO_COLOR": "1", "BATCHRUN_FROM": SENDER})
    full.update(env)
    return CliRunner().invoke(app, list(args), env=full)


def one_error_line(result: Result) -> str:
    """Exit 1 through the CLI's own handling, and stderr is one ``error:`` line."""
    err = ANSI.sub("", result.stderr)
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0].removeprefix("error: ")


def handed_on(result: Result, expected: str) -> dict[str, Any]:
    """Exit 3; stderr is the cause's line, then one saying the period waits for `batchrun
    retry`; the JSON summary (when --json) with ``stopped`` and ``continuation``."""
    err = ANSI.sub("", result.stderr)
    assert result.exit_code == 3, (result.exit_code, result.output)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith(expected), err
    assert "waits in the retry queue" in lines[1] and "batchrun retry" in lines[1], err
    if not result.stdout.lstrip().startswith("{"):
        return {}
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["stopped"] == lines[0] and data["continuation"] is True, data
    return data


def continuations(db_url: str) -> list[dict[str, Any]]:
    """The bodies of the continuation messages on the local queue."""
    bodies = [json.loads(str(r[0])) for r in query(db_url, "SELECT body FROM batchrun_queue")]
    return [b for b in bodies if b["kind"] == "continuation"]


def effects(db_url: str) -> tuple[int, int, int]:
    """(gift cards, ledger rows, queue messages) in the database."""
    return tuple(  # type: ignore[return-value]
        int(query(db_url, f"SELECT COUNT(*) FROM {table}")[0][0])
        for table in ("gift_card", "batchrun_ledger", "batchrun_queue")
    )


def unwritable_dir(path: Path) -> Iterator[Path]:
    """A directory nobody (root included) may create files in, or a skip."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o500)
        yield path
        path.chmod(0o700)
        return
    try:  # root ignores modes; an immutable directory refuses even root
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("running as root without chattr +i: no directory is unwritable")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


# -- 1. a broken setup stops the run before any effect --------------------------------------


@pytest.fixture
def broken_setups(
    tmp_path: Path, aws_env: dict[str, str]
) -> Iterator[dict[str, tuple[dict[str, str], str]]]:
    """case -> (environment, the line's expected text)."""
    notadir = tmp_path / "notadir"
    notadir.write_text("a regular file\n")
    port = free_port()
    with contextlib.contextmanager(unwritable_dir)(tmp_path / "locked") as locked:
        yield {
            "outbox is a file": (
                {"BATCHRUN_MAIL": f"file://{notadir}"},
                f"mail: cannot write to {notadir}: Not a directory",
            ),
            "outbox under a file": (
                {"BATCHRUN_MAIL": f"file://{notadir}/outbox"},
                f"mail: cannot write to {notadir}/outbox: Not a directory",
            ),
            "outbox not writable": (
                {"BATCHRUN_MAIL": f"file://{locked}"},
                f"mail: cannot write to {locked}: ",
            ),
            "smtp refused": (
                {"BATCHRUN_MAIL": f"smtp://mailer:{PASSWORD}@127.0.0.1:{port}"},
                f"mail: cannot connect to smtp://127.0.0.1:{port}: Connection refused",
            ),
            "ses unreachable": (
                {
                    "BATCHRUN_MAIL": "ses://us-east-1",
                    **aws_env,
                    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                },
                f"mail: cannot reach SES http://127.0.0.1:{port}: Could not connect",
            ),
            "sqs queue missing": (
                {
                    **aws_env,
                    "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
                    "BATCHRUN_RETRY_QUEUE": f"{aws_env['AWS_ENDPOINT_URL']}/123456789012/absent",
                },
                "could not read the attributes of SQS queue",
            ),
        }


def test_each_broken_setup_is_one_line_exit_1_and_nothing_done(
    sqlite_url: str, broken_setups: dict[str, tuple[dict[str, str], str]]
) -> None:
    migrate_and_seed_demo(sqlite_url, 300)
    for case, (env, expected) in broken_setups.items():
        if case in MAIL_DOWN:
            continue  # an outage, not a broken setup: the next test
        result = invoke(
            "birthday", "--month", MONTH, "--json", env={"BATCHRUN_DB": sqlite_url, **env}
        )
        line = one_error_line(result)
        assert line.startswith(expected), f"{case}: {line}"
        assert PASSWORD not in result.output, case
        # --json still prints the whole summary of a run that did not start: its error,
        # every count at 0 (a script reading data["emails_sent"] gets 0, not a KeyError)
        data = json.loads(result.stdout)
        assert data["error"].startswith(expected), f"{case}: {data}"
        assert all(key in data for key in DESIGN_KEYS), f"{case}: {data}"
        assert (data["job"], data["month"], data["dry_run"]) == ("birthday", MONTH, False)
        counts = [data[k] for k in DESIGN_KEYS[3:-1]]
        assert counts == [0] * len(counts) and data["continuation"] is False, f"{case}: {data}"
        assert effects(sqlite_url) == (0, 0, 0), f"{case}: something was claimed or queued"


def test_a_mail_backend_down_at_the_start_hands_the_period_on(
    sqlite_url: str, broken_setups: dict[str, tuple[dict[str, str], str]]
) -> None:
    migrate_and_seed_demo(sqlite_url, 300)
    for case in MAIL_DOWN:
        env, expected = broken_setups[case]
        result = invoke(
            "birthday", "--month", MONTH, "--json", env={"BATCHRUN_DB": sqlite_url, **env}
        )
        data = handed_on(result, expected)
        assert PASSWORD not in result.output, case
        assert all(key in data for key in DESIGN_KEYS), f"{case}: {data}"
        assert (data["job"], data["month"], data["dry_run"]) == ("birthday", MONTH, False)
        counts = [data[k] for k in DESIGN_KEYS[3:-1]]
        assert counts == [0] * len(counts) and "error" not in data, f"{case}: {data}"
        # Nothing claimed or created: the whole month waits as one continuation.
        assert effects(sqlite_url) == (0, 0, 1), f"{case}: claimed, created or queued"
        [body] = continuations(sqlite_url)
        assert (body["job"], body["period"], body["after_id"]) == ("birthday", MONTH, 0), body
        assert body.get("limit") is None, body
        query(sqlite_url, "DELETE FROM batchrun_queue")


def test_every_command_that_sends_checks_the_mailer_first(mysql_url: str) -> None:
    migrate_and_seed_demo(mysql_url, 300)
    port = free_port()
    env = {"BATCHRUN_DB": mysql_url, "BATCHRUN_MAIL": f"smtp://mailer:{PASSWORD}@127.0.0.1:{port}"}
    expected = f"mail: cannot connect to smtp://127.0.0.1:{port}: Connection refused"
    # A run finds the server down: nothing claimed, the period (with what --limit asked)
    # handed on for `batchrun retry`, exit 3.
    for queued, args in enumerate(
        (
            ("birthday", "--month", MONTH),
            ("run", "birthday", "--period", MONTH, "--limit", "7", "--json"),
        ),
        start=1,
    ):
        result = invoke(*args, env=env)
        handed_on(result, expected)
        assert PASSWORD not in result.output, args
        assert effects(mysql_url) == (0, 0, queued), args
    assert [b.get("limit") for b in continuations(mysql_url)] == [None, 7]
    # `retry` with the server down leaves the queue as it is: exit 1 (it would only burn
    # the messages' attempts); `worker` waits for the mail server (test_worker_waits_for_mail.py).
    result = invoke("retry", "--json", env=env)
    assert one_error_line(result) == expected
    assert PASSWORD not in result.output
    assert effects(mysql_url) == (0, 0, 2)
    # --json: the drain's whole summary, its counts at 0, the messages still queued (the
    # two continuations), and the error
    drained = json.loads(result.stdout)
    assert drained["error"] == expected, drained
    keys = ("processed", "succeeded", "skipped", "failed", "dead_lettered")
    assert [drained[k] for k in keys] == [0] * len(keys), drained
    assert drained["remaining"] == 2, drained
    # A queue that cannot be read cannot say how many wait: null, not a made-up 0.
    dead_queue = f"http://127.0.0.1:{free_port()}/123456789012/batchrun-retry"
    aws = {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    result = invoke("retry", "--json", env={**env, **aws, "BATCHRUN_RETRY_QUEUE": dead_queue})
    assert result.exit_code == 1
    unknown = json.loads(result.stdout)
    assert unknown["remaining"] is None and "SQS queue" in unknown["error"], unknown


def test_the_period_a_run_handed_on_is_done_by_retry(
    db_url: str, smtp_server: SmtpTestServer
) -> None:
    migrate_and_seed_demo(db_url, 600)
    want = want_ids(db_url)
    assert want
    down = {"BATCHRUN_DB": db_url, "BATCHRUN_MAIL": f"smtp://127.0.0.1:{free_port()}"}
    data = handed_on(invoke("birthday", "--month", MONTH, "--json", env=down), "mail: ")
    assert data["eligible"] == data["emails_sent"] == data["cards_created"] == 0, data
    assert effects(db_url) == (0, 0, 1)
    assert not smtp_server.messages

    up = {"BATCHRUN_DB": db_url, "BATCHRUN_MAIL": smtp_server.url}
    result = invoke("retry", "--json", env=up)
    assert result.exit_code == 0, result.output
    drained = json.loads(result.stdout)
    assert drained["failed"] == drained["remaining"] == 0, drained
    assert_one_card_and_one_email_each(db_url, smtp_server, want)
    status = json.loads(invoke("status", "--month", MONTH, "--json", env=up).stdout)
    assert (status["pending"], status["retrying"], status["retry_queue_depth"]) == (0, 0, 0)
    assert status["emails_sent"] == len(want), status


def test_submit_checks_the_queue_before_queueing(sqlite_url: str, aws_env: dict[str, str]) -> None:
    migrate_and_seed_demo(sqlite_url, 10)
    absent = f"{aws_env['AWS_ENDPOINT_URL']}/123456789012/absent"
    env = {"BATCHRUN_DB": sqlite_url, "BATCHRUN_RETRY_QUEUE": absent, **aws_env}
    line = one_error_line(invoke("submit", "birthday", "--period", MONTH, "--id", "1", env=env))
    assert "absent" in line and "SQS queue" in line, line


def test_a_dry_run_with_a_broken_mailer_still_counts_and_writes_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    migrate_and_seed_demo(sqlite_url, 300)
    notadir = tmp_path / "notadir"
    notadir.write_text("")
    env = {"BATCHRUN_DB": sqlite_url, "BATCHRUN_MAIL": f"file://{notadir}/outbox"}
    result = invoke("birthday", "--month", MONTH, "--dry-run", "--json", env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["eligible"] > 0
    assert effects(sqlite_url) == (0, 0, 0)


# -- the checks themselves, on real servers ------------------------------------------------


async def test_smtp_check_opens_and_quits_one_session_and_sends_nothing(
    smtp_server: SmtpTestServer,
) -> None:
    mailer = SmtpMailer("127.0.0.1", smtp_server.port, timeout=2)
    try:
        await mailer.check()
        assert smtp_server.connections_opened == 1
        assert smtp_server.transactions == 0 and not smtp_server.messages
        assert mailer.open_connections == 0, "the check's session is closed (QUIT)"
    finally:
        await mailer.close()


async def test_smtp_check_names_a_refused_login_without_the_password(
    smtp_server: SmtpTestServer,
) -> None:
    # The test server offers no AUTH: a login is refused, as a wrong password would be.
    mailer = SmtpMailer(
        "127.0.0.1", smtp_server.port, username="mailer", password=PASSWORD, timeout=2
    )
    with pytest.raises(MailConnectionError) as caught:
        await mailer.check()
    assert str(caught.value).startswith(f"smtp://127.0.0.1:{smtp_server.port}: ")
    assert PASSWORD not in str(caught.value)


async def greeting(reply: str) -> asyncio.Server:
    """An SMTP server on a free loopback port that greets with ``reply`` and hangs up."""

    async def greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"{reply}\r\n".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(greet, "127.0.0.1", 0)


async def test_a_check_tells_a_server_not_answering_from_a_setup_to_fix(
    smtp_server: SmtpTestServer, aws_env: dict[str, str]
) -> None:
    port = free_port()
    down: list[tuple[SmtpMailer | SesMailer, str]] = [
        (SmtpMailer("127.0.0.1", port, timeout=2), "Connection refused"),
        (
            SesMailer("us-east-1", env={**aws_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}),
            "Could not connect",
        ),
    ]
    fix: list[tuple[SmtpMailer | SesMailer, str]] = [
        # The test server offers no AUTH: the login fails, as a wrong password would.
        (
            SmtpMailer("127.0.0.1", smtp_server.port, username="u", password=PASSWORD, timeout=2),
            "AUTH",
        ),
        (SmtpMailer("no-such-host.invalid", 25, timeout=5), "cannot connect to smtp://"),
    ]
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never greets
        down.append((SmtpMailer("127.0.0.1", silent.getsockname()[1], timeout=0.5), "0.5 s"))
        async with await greeting("421 4.3.2 Service not available") as closing:
            closing_port = closing.sockets[0].getsockname()[1]
            down.append((SmtpMailer("127.0.0.1", closing_port, timeout=2), "421 4.3.2"))
            async with await greeting("554 5.7.1 No SMTP service here") as refusing:
                refusing_port = refusing.sockets[0].getsockname()[1]
                fix.append((SmtpMailer("127.0.0.1", refusing_port, timeout=2), "554 5.7.1"))
                for mailer, says in down + fix:
                    try:
                        with pytest.raises(MailConnectionError, match=re.escape(says)) as caught:
                            await mailer.check()
                    finally:
                        await mailer.close()
                    unreachable = isinstance(caught.value, MailUnreachableError)
                    assert unreachable is ((mailer, says) in down), caught.value


async def test_file_check_creates_the_outbox_and_leaves_no_file(tmp_path: Path) -> None:
    outbox = tmp_path / "deep" / "outbox"
    await FileMailer(outbox).check()
    assert outbox.is_dir() and list(outbox.iterdir()) == []


async def test_ses_check_on_moto_and_its_failures(aws_env: dict[str, str]) -> None:
    mailer = SesMailer("us-east-1", env=aws_env, timeout=5)
    try:
        await mailer.check()  # moto answers GetAccount with an error reply: SES is there
        client = await mailer.open()
        client.meta.events.register(
            "before-send.sesv2.GetAccount",
            answer_with(400, "UnrecognizedClientException", {"message": "bad key"}, times=1),
        )
        with pytest.raises(MailConnectionError, match="refused the credentials"):
            await mailer.check()
        paused = {"SendingEnabled": False, "EnforcementStatus": "PROBATION"}
        client.meta.events.register(
            "before-send.sesv2.GetAccount", answer_with(200, None, paused, times=1)
        )
        with pytest.raises(MailConnectionError, match=r"sending is disabled .*PROBATION"):
            await mailer.check()
    finally:
        await mailer.close()


async def test_sqs_check_asks_sqs_each_time(
    aws_env: dict[str, str], moto_server: MotoServer
) -> None:
    url = str(aws_client(moto_server).create_queue(QueueName="preflight")["QueueUrl"])
    queue = SqsQueue(url, env=aws_env)
    try:
        await queue.check()
        aws_client(moto_server).delete_queue(QueueUrl=url)
        with pytest.raises(QueueError, match="preflight"):
            await queue.check()  # opened before, yet asked again
    finally:
        await queue.close()


# -- 2. a failing tiny run ends at once ------------------------------------------------------


def fail_after(count: int, reply: str) -> Callable[[str, int], str | None]:
    """Accept the first ``count`` transactions, answer ``reply`` to every later one."""
    return lambda _rcpt, number: reply if number > count else None


@pytest.mark.parametrize("breakage", ["smtp closes after 3 messages", "outbox becomes a file"])
async def test_a_tiny_run_whose_mail_breaks_ends_at_once(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
    tmp_path: Path,
    breakage: str,
) -> None:
    await seed_users(store, 300, seed=12)
    outbox = tmp_path / "outbox"
    if breakage.startswith("smtp"):
        smtp_server.set_policy(fail_after(3, CLOSING))
        job: Runtime = await make_job(db_url, mail_url=smtp_server.url, breaker_threshold=3)
    else:
        job = await make_job(db_url, mail_url=f"file://{outbox}")
        await job.preflight()  # the outbox was fine when the run started ...
        outbox.rmdir()
        outbox.write_text("")  # ... and every write fails at once from here on
    started = time.monotonic()
    summary = await job.run(JUNE, Options(concurrency=20))
    took = time.monotonic() - started
    assert summary.stopped and "circuit breaker" in summary.stopped, summary
    assert summary.exit_code == 3 and summary.queued_for_retry > 0
    # The grace (30 s) is for work in flight; with none left the run must not wait.
    assert took < 10, f"a failing run of 300 users took {took:.1f} s"


# -- 3. two failed runs, one retry: nothing left, numbers agree -------------------------------


async def test_two_failed_runs_then_one_retry_leave_the_queue_empty(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 2000, seed=15)  # about 150 June birthdays
    smtp_server.set_policy(fail_after(0, CLOSING))
    for _ in range(2):
        down: Runtime = await make_job(db_url, mail_url=smtp_server.url)
        summary = await down.run(JUNE, Options(concurrency=10))
        assert summary.exit_code == 3 and summary.emails_sent == 0, summary
    waiting = await down.status("birthday", JUNE)
    bodies = [json.loads(r[0]) for r in query(db_url, "SELECT body FROM batchrun_queue")]
    per_user = Counter(b["id"] for b in bodies if b["kind"] == "retry")
    assert per_user and max(per_user.values()) == 1, "one retry message per user"
    assert len(per_user) == waiting["retrying"]

    smtp_server.set_policy(None)
    up: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    result = await up.retry(Options(concurrency=20))
    assert result.failed == 0 and result.remaining == 0, result
    shown = run_cli("status", "--month", MONTH, "--json", env={"BATCHRUN_DB": db_url})
    counts = json.loads(shown.stdout)
    assert counts["retrying"] == 0 and counts["retry_queue_depth"] == 0, counts
    done = counts["emails_sent"] + counts["skipped"]  # an invalid address waited too
    assert counts["pending"] == 0 and done == len(per_user), json.dumps(counts)
    assert set(smtp_server.sends_per_user(2025).values()) == {1}
    assert await up.queue.depths() == (0, 0)  # type: ignore[union-attr]


# -- 4. migrate on an application's own tables ------------------------------------------------


def test_migrate_next_to_a_foreign_user_table_creates_nothing(sqlite_url: str) -> None:
    query(sqlite_url, "CREATE TABLE user (id INTEGER PRIMARY KEY, login TEXT, created TEXT)")
    query(sqlite_url, "INSERT INTO user VALUES (1, 'ada', '2020-01-01')")
    env = {"BATCHRUN_DB": sqlite_url}
    first = one_error_line(invoke("db", "migrate", env=env))
    assert first.startswith(
        "job 'birthday' needs user.first_name, user.last_name, user.email, "
        "user.date_of_birth, user.status, missing from this database"
    ), first
    assert "db migrate" not in first, "not: run the command just run"
    tables = query(sqlite_url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    assert tables == [("user",)], "no table of batchrun's or the job's left behind"
    assert query(sqlite_url, "SELECT * FROM user") == [(1, "ada", "2020-01-01")]
    assert one_error_line(invoke("db", "migrate", env=env)) == first, "a rerun says the same"
    assert one_error_line(invoke("birthday", "--month", MONTH, env=env)) == first


def test_migrate_in_a_database_with_users_not_user(mysql_url: str) -> None:
    query(
        mysql_url,
        "CREATE TABLE users (id BIGINT PRIMARY KEY, email VARCHAR(255), name VARCHAR(100))",
    )
    env = {"BATCHRUN_DB": mysql_url}
    migrated = invoke("db", "migrate", env=env)
    assert migrated.exit_code == 0, migrated.output
    notes = [line for line in migrated.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "job 'birthday' needs user, gift_card" in notes[0], notes
    tables = {str(r[0]) for r in query(mysql_url, "SHOW TABLES")}
    assert "user" not in tables and "gift_card" not in tables, tables
    assert one_error_line(invoke("birthday", "--month", MONTH, env=env)) == notes[0].removeprefix(
        "note: "
    )

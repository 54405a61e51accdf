"""Security: gift codes, SQL built only from named queries, no secret in any output,
no header injection, an owner-only outbox, and a Lambda role that grants what the code calls.

Elsewhere already: the outbox's modes in-process (tests/adapters/test_mail.py::
test_file_mailer_is_owner_only_and_overwrites_on_resend), header injection by a display
name or subject (tests/adapters/test_mail.py::
test_control_characters_in_name_or_subject_never_add_a_header), the role's shape
(tests/adapters/test_lambda_package.py::test_role_grants_only_what_the_function_uses), a
gift-code collision retried (tests/adapters/test_store.py::
test_gift_code_collision_is_retried_with_a_fresh_code). Here: the same promises end to end,
through the CLI.
"""

from __future__ import annotations

import ast
import asyncio
import email
import email.policy
import json
import logging
import math
import os
import re
import sqlite3
import stat
import subprocess
import sys
import unicodedata
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pymysql
import pytest
from cfnlint.decode import decode
from support import ROOT
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.birthday import card_counts, seed_users, user_of
from support.cli import cli_env, run_cli, summary_of
from support.db import MYSQL_URL, query, table_digest
from support.http_server import GrantsTestServer
from support.job_cases import CreditsCase
from support.periods import month
from support.smtp_server import SmtpTestServer

from batchrun import aws_lambda
from batchrun.db.sql import load
from batchrun.errors import BatchrunError
from batchrun.jobs.birthday import Birthday, codes
from batchrun.runtime import Options, Runtime
from batchrun.runtime.resources import open_backends
from batchrun.settings import Settings

PACKAGE = ROOT / "batchrun"
SENDER = "birthday@example.com"

# -- gift codes ---------------------------------------------------------------------------------

_CODE = re.compile(r"[0-9A-HJKMNP-TV-Z]{16}")  # Crockford base32: no I, L, O, U
_MAKE_CODES = (
    "import sys\n"
    "from batchrun.jobs.birthday import codes\n"
    "sys.stdout.write('\\n'.join(codes.new_code() for _ in range(int(sys.argv[1]))))\n"
)


def test_gift_code_alphabet_is_unambiguous_and_holds_at_least_60_bits() -> None:
    assert len(set(codes.ALPHABET)) == len(codes.ALPHABET) == 32
    assert not set(codes.ALPHABET) & set("ILOU"), "no letters read as 1, 1, 0 or V"
    assert codes.ALPHABET.upper() == codes.ALPHABET
    bits = codes.LENGTH * math.log2(len(codes.ALPHABET))
    assert bits >= 60, bits
    assert bits == 80
    # The generator draws from `secrets`, never from `random`.
    tree = ast.parse((PACKAGE / "jobs" / "birthday" / "codes.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "secrets" in imported and "random" not in imported, imported


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_million_gift_codes_are_unique_and_use_only_the_alphabet() -> None:
    # Two processes, 500,000 codes each: a generator seeded per process (or by the clock)
    # would repeat codes across them, and the two halves run on both cores.
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _MAKE_CODES, "500000"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    made: list[str] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=280)
        assert worker.returncode == 0
        made.extend(out.split("\n"))
    assert len(made) == 1_000_000
    assert len(set(made)) == len(made), "a repeated gift code"
    assert all(_CODE.fullmatch(code) for code in made)
    # Uniform over the alphabet at every position: 31,250 expected, sigma ~174.
    joined = "".join(made)
    for position in range(codes.LENGTH):
        counts = Counter(joined[position :: codes.LENGTH])
        assert set(counts) == set(codes.ALPHABET)
        assert max(abs(n - 31_250) for n in counts.values()) < 1_500, (position, counts)


def test_gift_codes_are_unique_in_the_database_and_a_lasting_collision_fails_cleanly(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli("db", "migrate", env={"BATCHRUN_DB": db_url}).returncode == 0
    row = ("a@example.com", "hi", 1, "2025-06-01 00:00:00", "TAKEN0TAKEN0TAKE", "other:1")
    insert = (
        "INSERT INTO gift_card (recipient_email, message, status, scheduled_at, gift_code, "
        "idempotency_key) VALUES (%s, %s, %s, %s, %s, %s)"
    )
    query(db_url, insert, *row)
    with pytest.raises(
        (pymysql.err.IntegrityError, sqlite3.IntegrityError, psycopg.errors.IntegrityError)
    ):
        query(db_url, insert, *row[:5], "other:2")  # same code, another card

    async def go() -> None:
        settings = Settings(db_url=db_url, mail_url="discard://")
        async with open_backends(settings, mail=True, queue=True) as backends:
            await seed_users(backends.store, 300, seed=1)
            monkeypatch.setattr(codes, "new_codes", lambda n: ["TAKEN0TAKEN0TAKE"] * n)
            rt = Runtime(Birthday(), backends.store, backends.mailer, backends.queue, settings)
            summary = await rt.run(month(2025, 6), Options(limit=3))
            assert (summary.queued_for_retry, summary.emails_sent) == (3, 0), summary
        reasons = query(db_url, "SELECT last_error FROM batchrun_ledger")
        assert len(reasons) == 3
        assert all("unique gift code" in str(r) for (r,) in reasons), reasons

    asyncio.run(go())
    assert card_counts(db_url, 2025) == {}, "no card, rather than a shared code"


# -- SQL is never built by formatting strings ----------------------------------------------

_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|ALTER|DROP|PRAGMA)\s+[\w`*(]")


# Text that looks like SQL but is no query with values: PostgreSQL cannot bind an
# identifier, so CREATE DATABASE names the (quoted) database itself, and a regex
# recognises the step that drops an INVALID index.
_NOT_QUERIES = {"batchrun/db/postgresql.py": ("CREATE DATABASE", "DROP INDEX CONCURRENTLY")}


def _not_a_query(where: str, text: str) -> bool:
    return any(t in text for t in _NOT_QUERIES.get(where, ()))


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_no_sql_in_python_strings_and_every_statement_is_bound_by_the_driver() -> None:
    named = set(load("mysql").statements) & set(load("sqlite").statements)
    sql_like: list[str] = []
    unnamed: list[str] = []
    dynamic: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and _SQL.search(node.value)
                and not _not_a_query(str(where), node.value)
            ):
                sql_like.append(f"{where}:{node.lineno}: {node.value[:60]!r}")
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            first = node.args[0] if node.args else None
            receiver = node.func.value
            owner = receiver.attr if isinstance(receiver, ast.Attribute) else None
            owner = receiver.id if isinstance(receiver, ast.Name) else owner
            # The store and the queue name a query; the adapter compiles it to placeholders.
            if (
                owner == "db"
                and node.func.attr in {"execute", "fetchall", "fetchone", "fetchval", "fetch"}
                and not (isinstance(first, ast.Constant) and first.value in named)
                and not _job_query(first)
            ):
                unnamed.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
            # The adapters hand the driver compiled text and the values apart.
            if path.parent.name == "db" and node.func.attr in {"execute", "executemany"}:
                if owner == "db":
                    continue
                if not isinstance(first, ast.Name | ast.Attribute) and not (
                    first is not None and _not_a_query(str(where), ast.unparse(first))
                ):
                    dynamic.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert sql_like == [], "SQL lives in batchrun/sql/<dialect>/*.sql, never in Python"
    assert unnamed == [], "every statement is a named query shipped for both dialects"
    assert dynamic == [], "the driver gets compiled text, never text built from values"


def _job_query(node: ast.expr | None) -> bool:
    """``ctx.sql("name")`` or ``sql.text(dialect, "name")``: a job's named query, shipped
    for both dialects in its SqlFolder (the birthday job's, inside the package)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr not in ("sql", "text") or not node.args:
        return False
    name = node.args[-1]
    folder = Birthday.sql
    assert folder is not None
    return isinstance(name, ast.Constant) and all(
        name.value in folder.statements(dialect) for dialect in ("mysql", "sqlite")
    )


HOSTILE_NAMES = [
    "Robert'); DROP TABLE user;--",
    "' OR '1'='1",
    "\\'; DELETE FROM gift_card; --",
    '"; DROP TABLE batchrun_queue; --',
    "`; DROP TABLE batchrun_task; --",
    "%s %s %(name)s %%",
    ":name :after :limit*",
    "?, ?); --",
]
HOSTILE_VALID = ["o'brien@example.com", "x'--@example.com", "a%s@example.com", "q?q@example.com"]
HOSTILE_INVALID = ["a%(x)s@example.com", "b';DROP TABLE user;--@example.com", "c:name@example.com"]
HOSTILE_CARD = "'); DROP TABLE gift_card; -- %s :message ?"
HOSTILE_REPLY = "451 4.3.0 ');DROP TABLE batchrun_queue;-- %s :now ?"


@pytest.mark.slow
def test_hostile_names_addresses_and_texts_are_stored_as_data(
    db_url: str, smtp_server: SmtpTestServer
) -> None:
    env = cli_env(db_url, smtp_server.url, BATCHRUN_CARD_MESSAGE=HOSTILE_CARD)
    assert run_cli("db", "migrate", env=env).returncode == 0
    ids: dict[str, int] = {}
    addresses = HOSTILE_VALID + HOSTILE_INVALID
    for i, address in enumerate(addresses):
        name = HOSTILE_NAMES[i % len(HOSTILE_NAMES)]
        query(
            db_url,
            "INSERT INTO user (first_name, last_name, email, date_of_birth, status) "
            "VALUES (%s, %s, %s, %s, 10)",
            name,
            HOSTILE_NAMES[-1 - i % len(HOSTILE_NAMES)],
            address,
            f"1990-06-{i + 1:02d}",
        )
        ids[address] = int(query(db_url, "SELECT MAX(id) FROM user")[0][0])
    tables = sorted(table_digest(db_url))
    users_before = table_digest(db_url, ["user"])
    victim = HOSTILE_VALID[0]
    smtp_server.set_policy(lambda rcpt, _n: HOSTILE_REPLY if rcpt == victim else None)

    first = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert first.returncode == 3, first.stderr
    summary = summary_of(first)
    assert (summary["skipped"], summary["queued_for_retry"]) == (len(HOSTILE_INVALID), 1)
    (error,) = query(
        db_url, "SELECT last_error FROM batchrun_ledger WHERE entity_id = %s", ids[victim]
    )[0]
    assert error == HOSTILE_REPLY, "the server's reply is stored verbatim"
    (body,) = query(db_url, "SELECT body FROM batchrun_queue")[0]
    assert json.loads(body)["reason"] == HOSTILE_REPLY

    smtp_server.set_policy(None)
    retry = run_cli("retry", "--json", env=env)
    assert retry.returncode == 0, retry.stderr
    assert sorted(table_digest(db_url)) == tables, "no table dropped or added"
    assert table_digest(db_url, ["user"]) == users_before, "the user table is only read"
    cards = query(db_url, "SELECT recipient_email, message, idempotency_key FROM gift_card")
    assert sorted(c[0] for c in cards) == sorted(HOSTILE_VALID)
    assert {c[1] for c in cards} == {HOSTILE_CARD}
    assert card_counts(db_url, 2025) == {ids[a]: 1 for a in HOSTILE_VALID}
    sent = {m.recipients[0]: m for m in smtp_server.messages}
    assert sorted(sent) == sorted(HOSTILE_VALID), "each exact address, once"


# -- no password or secret in any output ---------------------------------------------------

DB_PASSWORD = "S3cr3t/pw:x@y%z-DB"
MAIL_PASSWORD = "M4il/pw:q@r%s-SMTP"
AWS_SECRET = "AwsS3cretKey+fault7/xyz"
AWS_TOKEN = "AwsS3ssionT0ken-fault7"


def needles(*passwords: str) -> list[str]:
    """Each secret as written and as URL-encoded in a URL."""
    found: list[str] = []
    for password in passwords:
        found += [password, quote(password, safe="")]
    return found


def assert_no_secret(text: str, where: str, secrets: list[str]) -> None:
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"{where} shows {leaked}: ...{_around(text, leaked[0])}..."


def _around(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(0, at - 120) : at + len(secret) + 40]


@pytest.fixture
def secret_db_url(mysql_url: str) -> Iterator[str]:
    """The test database, reached as a MySQL user with a password full of URL specials."""
    parts = urlsplit(MYSQL_URL)
    database = urlsplit(mysql_url).path.lstrip("/")
    user = f"br_t_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        autocommit=True,
    )
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (DB_PASSWORD,))
            cur.execute(f"GRANT ALL ON `{database}`.* TO '{user}'@'%%'", ())
        host = f"{parts.hostname or '127.0.0.1'}:{parts.port or 3306}"
        yield f"mysql://{user}:{quote(DB_PASSWORD, safe='')}@{host}/{database}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%%'", ())
        admin.close()


def _all_rows(db_url: str) -> str:
    """Every row of every table, as text."""
    names = [r[0] for r in query(db_url, "SHOW TABLES")]
    return "\n".join(repr(query(db_url, f"SELECT * FROM `{name}`")) for name in names)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_no_password_in_any_command_output_error_queue_row_or_table(
    secret_db_url: str, mysql_url: str, smtp_server: SmtpTestServer
) -> None:
    secrets = needles(DB_PASSWORD, MAIL_PASSWORD)
    # The test server offers no AUTH: every login fails, found by each run's preflight.
    mail = f"smtp://mailer:{quote(MAIL_PASSWORD, safe='')}@127.0.0.1:{smtp_server.port}"
    env = cli_env(secret_db_url, mail, BATCHRUN_BREAKER_THRESHOLD="2")
    database = urlsplit(secret_db_url).path.lstrip("/")
    wrong_db = secret_db_url.replace(f"/{database}", "/batchrun_t_no_such_db")
    unreachable = re.sub(r"@[^/]+/", "@127.0.0.1:1/", secret_db_url)
    runs: list[tuple[tuple[str, ...], dict[str, str], set[int]]] = [
        (("db", "migrate"), {}, {0}),
        (("db", "seed", "--users", "600", "--seed", "3"), {}, {0}),
        (("-vv", "db", "explain", "--month", "2025-06"), {}, {0}),
        (("birthday", "--month", "2025-06", "--dry-run", "--json"), {}, {0}),
        (("birthday", "--month", "2025-06", "--json"), {}, {1}),
        (("-v", "birthday", "--month", "2025-07"), {}, {1}),
        (("-vv", "birthday", "--month", "2025-08", "--json"), {}, {1}),
        (("status", "--month", "2025-06"), {}, {0}),
        (("status", "--month", "2025-06", "--json"), {}, {0}),
        (("-vv", "retry", "--json"), {}, {1}),
        (("retry",), {}, {1}),
        # The worker waits while its mail check fails (one line, URL masked) until SIGTERM.
        (("-v", "worker", "--idle-exit", "1", "--json"), {}, {0, 130}),
        (("-v", "status"), {"BATCHRUN_DB": wrong_db}, {1}),
        (("status",), {"BATCHRUN_DB": wrong_db}, {1}),
        (("-v", "birthday", "--month", "2025-06"), {"BATCHRUN_DB": unreachable}, {1}),
        (("birthday", "--month", "2025-06"), {"BATCHRUN_MAIL": mail.replace(":", "x:", 1)}, {2}),
        (("birthday", "--month", "2025-06"), {"BATCHRUN_MAIL": mail + ":99x"}, {2}),
        (("--mail", mail, "--db", secret_db_url, "birthday", "--month", "2025-13"), {}, {2}),
    ]
    for args, overrides, codes_ok in runs:
        stop = 4.0 if args[1:2] == ("worker",) else None
        result = run_cli(*args, env=env | overrides, timeout=90, sigterm_after=stop)
        where = f"`batchrun {' '.join(args)}` (exit {result.returncode})"
        assert result.returncode in codes_ok, f"{where}: {result.stderr[-2000:]}"
        assert_no_secret(result.stdout + result.stderr, where, secrets)
        if args == ("db", "migrate"):
            assert ":***@" in result.stderr, "the URL is shown, masked"
        if args == ("birthday", "--month", "2025-06", "--json"):
            assert f"mail: smtp://127.0.0.1:{smtp_server.port}: " in result.stderr, result.stderr
    failures = query(mysql_url, "SELECT COUNT(*) FROM batchrun_ledger")
    assert failures[0][0] == 0, "the preflight stopped every run before it claimed anyone"
    assert_no_secret(_all_rows(mysql_url), "the database (ledger, queue, cards)", secrets)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_backend_key_in_logs_failure_reasons_errors_or_the_webhooks_line(
    smtp_server: SmtpTestServer, grants: GrantsTestServer, sqlite_url: str
) -> None:
    """A backend URL may hold a password, and its path or query a key (a Slack webhook's
    path is one): httpx's request lines at -v, a call's failure reason (ledger, queue,
    ``why``, ``dead list``) and a bad URL's error name only its scheme, host, port and
    the endpoint called. A webhook URL that cannot be used is not quoted either."""
    case = CreditsCase(smtp_server, grants)
    entities = case.seed(sqlite_url, 20)
    port = urlsplit(grants.url).port
    keyed = f"http://u:BkS3cr3tPW@127.0.0.1:{port}/K3yPathSecret"  # the API answers 404
    secrets = ["BkS3cr3tPW", "K3yPathSecret", "T0kenXYZ"]
    env = case.env(
        sqlite_url,
        BATCHRUN_BACKEND_CREDITS_URL=keyed,
        BATCHRUN_NOTIFY_URL="http://127.0.0.1:1/hook?token=T0ken\tXYZ",
        BATCHRUN_NOTIFY_ON="always",
    )
    ran = run_cli(*case.args("-v", "run", "credits", "--period", case.period, "--json"), env=env)
    assert ran.returncode == 0, ran.stderr
    assert f"HTTP Request: POST http://127.0.0.1:{port}/…/grants" in ran.stderr, ran.stderr
    assert "notification to http://127.0.0.1:1 not delivered" in ran.stderr, ran.stderr
    assert_no_secret(ran.stdout + ran.stderr, "`-v run credits`", secrets)
    reasons = [str(r[0]) for r in query(sqlite_url, "SELECT last_error FROM batchrun_ledger")]
    assert f"HTTP 404 from http://127.0.0.1:{port}/…/grants" in reasons, reasons
    entity = str(min(entities.want))
    for args in (
        ("dead", "list", "--json"),
        ("why", "credits", entity, "--period", case.period, "--json"),
        ("status", "credits", "--period", case.period, "--json"),
    ):
        shown = run_cli(*case.args(*args), env=env)
        assert shown.returncode == 0, shown.stderr
        assert_no_secret(shown.stdout + shown.stderr, f"`{' '.join(args)}`", secrets)
    assert_no_secret(_all_sqlite_rows(sqlite_url), "the database", secrets)
    bad = env | {"BATCHRUN_BACKEND_CREDITS_URL": "ftp://u:BkS3cr3tPW@127.0.0.1/K3yPathSecret"}
    refused = run_cli(*case.args("run", "credits", "--period", case.period), env=bad)
    assert refused.returncode == 2, refused.stderr
    assert "must be an http(s):// URL, got a ftp:// one" in refused.stderr, refused.stderr
    assert_no_secret(refused.stdout + refused.stderr, "a bad backend URL's error", secrets)


def _all_sqlite_rows(db_url: str) -> str:
    """Every row of every table of a SQLite file, as text."""
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(conn.execute(f'SELECT * FROM "{n}"').fetchall()) for n in names)


def _aws_env(server: MotoServer) -> dict[str, str]:
    return server.env | {"AWS_SECRET_ACCESS_KEY": AWS_SECRET}


def _drain_all(sqs: Any, url: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while True:
        got = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return messages
        for message in got:
            messages.append(message)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_no_secret_in_sqs_messages_logs_or_lambda_output(
    secret_db_url: str,
    smtp_server: SmtpTestServer,
    moto_server: MotoServer,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secrets = needles(DB_PASSWORD, MAIL_PASSWORD, AWS_SECRET)
    moto_server.reset()
    sqs = aws_client(moto_server)
    queue_url, dlq = make_queue_with_dlq(moto_server, "retry", dlq_name="dlq", max_receives=1)
    mail = f"smtp://mailer:{quote(MAIL_PASSWORD, safe='')}@127.0.0.1:{smtp_server.port}"
    aws = _aws_env(moto_server)
    env = cli_env(secret_db_url, mail, BATCHRUN_RETRY_QUEUE=queue_url, **aws)
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "400", "--seed", "4", env=env).returncode == 0
    runs = (("-v", "birthday", "--month", "2025-06", "--json"), ("-v", "retry", "--json"))
    for args in runs:
        result = run_cli(*args, env=env, timeout=120)
        assert result.returncode == 1, result.stderr  # the preflight: no AUTH on this server
        assert_no_secret(result.stdout + result.stderr, " ".join(args), secrets)
    # Failures after the start: the server takes the session, then closes the channel
    # (421) on every message, so the breaker opens and the run logs why.
    smtp_server.set_policy(lambda _rcpt, _n: "421 4.3.2 Service not available")
    failing = env | {"BATCHRUN_MAIL": smtp_server.url}
    for args in runs:
        result = run_cli(*args, env=failing, timeout=120)
        assert result.returncode == 3, result.stderr
        assert_no_secret(result.stdout + result.stderr, " ".join(args), secrets)

    # In-process, every log record at DEBUG, batchrun's and its libraries' alike.
    caplog.set_level(logging.DEBUG)
    settings = Settings.from_env(env | {"BATCHRUN_MAX_RECEIVES": "1"})
    settings_failing = Settings.from_env(failing | {"BATCHRUN_MAX_RECEIVES": "1"})

    async def go() -> None:
        async with open_backends(settings, mail=True, queue=True, concurrency=4) as backends:
            job = Runtime(Birthday(), backends.store, backends.mailer, backends.queue, settings)
            with pytest.raises(BatchrunError) as refused:
                await job.run(month(2025, 7), Options(concurrency=4))
            assert_no_secret(str(refused.value), "the preflight's error", secrets)
        async with open_backends(
            settings_failing, mail=True, queue=True, concurrency=4
        ) as backends:
            job = Runtime(
                Birthday(), backends.store, backends.mailer, backends.queue, settings_failing
            )
            await job.run(month(2025, 7), Options(concurrency=4))
            await job.retry(Options(concurrency=4))
        wrong = settings.with_overrides(db_url=secret_db_url.rsplit("/", 1)[0] + "/nope_db")
        with pytest.raises(BatchrunError) as caught:
            async with open_backends(wrong):
                pass
        assert_no_secret(str(caught.value), "a DatabaseError", secrets)

    asyncio.run(go())
    assert any(r.levelno >= logging.ERROR for r in caplog.records), "the failing paths logged"
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        if record.exc_info:
            text += logging.Formatter().formatException(record.exc_info)
        assert_no_secret(text, f"log record {record.name}:{record.levelname}", secrets)

    # The Lambda: its JSON log line and EMF metrics on stdout, and its one-line error.
    environ = failing | {"BATCHRUN_MAX_RECEIVES": "1"}
    aws_lambda.handle({"job": "birthday", "month": "2025-09"}, _Context(), environ=environ)
    with pytest.raises(BatchrunError) as caught:
        aws_lambda.handle(
            {"job": "birthday", "month": "2025-09"},
            _Context(),
            environ=environ | {"BATCHRUN_DB": secret_db_url.rsplit("/", 1)[0] + "/nope_db"},
        )
    assert_no_secret(str(caught.value), "the Lambda's error", secrets)
    out, err = capsys.readouterr()
    assert '"status": "error"' in out
    assert_no_secret(out + err, "the Lambda's log lines", secrets)

    messages = _drain_all(sqs, queue_url) + _drain_all(sqs, dlq)
    assert messages, "the failures were queued and dead-lettered"
    assert_no_secret(json.dumps(messages), "SQS message bodies and attributes", secrets)


class _Context:
    aws_request_id = "security-1"

    def get_remaining_time_in_millis(self) -> int:
        return 120_000


def test_vv_never_prints_aws_credentials(moto_server: MotoServer, tmp_path: Path) -> None:
    moto_server.reset()
    queue_url = aws_client(moto_server).create_queue(QueueName="retry")["QueueUrl"]
    db = f"sqlite:///{tmp_path / 'x.db'}"
    aws = _aws_env(moto_server) | {"AWS_SESSION_TOKEN": AWS_TOKEN}
    env = cli_env(db, f"file://{tmp_path / 'outbox'}", BATCHRUN_RETRY_QUEUE=queue_url, **aws)
    assert run_cli("db", "migrate", env=env).returncode == 0
    result = run_cli("-vv", "status", env=env)
    assert result.returncode == 0, result.stderr
    assert_no_secret(result.stdout + result.stderr, "-vv", [AWS_SECRET, AWS_TOKEN])


# -- no header injection ---------------------------------------------------------------------

INJECTING_NAMES = [
    "Eve\r\nBcc: evil@attacker.example",
    "Eve\nTo: evil@attacker.example",
    "Eve\rCc: evil@attacker.example",
    "\r\n\r\nInjected body",
    "Eve\x00\x85\u2028\u2029Bcc: evil@attacker.example",
    'Eve" <evil@attacker.example>, "X',
    "=?utf-8?q?evil?= <evil@attacker.example>",
    "evil@attacker.example, other@x",  # short: stays one quoted display name
]
INJECTING_ADDRESSES = [
    "victim@example.com\r\nBcc: evil@attacker.example",
    "victim@example.com\nRCPT TO:<evil@attacker.example>",
    "victim@example.com, evil@attacker.example",
    "victim@example.com>\r\nBcc: <evil@attacker.example",
    '"evil@attacker.example"@example.com',
    "victim@example.com\u2028Bcc: evil@attacker.example",
]
HEADERS = {
    "From",
    "To",
    "Subject",
    "Date",
    "Message-ID",
    "X-Batchrun-Id",
    "Auto-Submitted",
    "MIME-Version",
    "Content-Type",
}


@pytest.mark.parametrize("backend", ["smtp", "file"])
def test_a_name_or_an_address_never_injects_a_header(
    sqlite_url: str, smtp_server: SmtpTestServer, tmp_path: Path, backend: str
) -> None:
    outbox = tmp_path / "outbox"
    mail = smtp_server.url if backend == "smtp" else f"file://{outbox}"
    env = cli_env(sqlite_url, mail)
    assert run_cli("db", "migrate", env=env).returncode == 0
    emails: dict[int, str] = {}
    rows = [(name, f"user{i}@example.com") for i, name in enumerate(INJECTING_NAMES)]
    rows += [("Mallory", address) for address in INJECTING_ADDRESSES]
    for i, (name, address) in enumerate(rows):
        query(
            sqlite_url,
            "INSERT INTO user (first_name, last_name, email, date_of_birth, status) "
            "VALUES (%s, %s, %s, %s, 10)",
            name,
            name,
            address,
            f"1990-06-{i + 1:02d}",
        )
        emails[int(query(sqlite_url, "SELECT MAX(id) FROM user")[0][0])] = address
    run = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert run.returncode == 0, run.stderr
    summary = summary_of(run)
    assert summary["emails_sent"] == len(INJECTING_NAMES)
    assert summary["skipped"] == len(INJECTING_ADDRESSES), "hostile addresses are refused"

    if backend == "smtp":
        received = [(m.raw, m.recipients) for m in smtp_server.messages]
    else:
        assert stat.S_IMODE(outbox.stat().st_mode) == 0o700
        received = [(p.read_bytes(), None) for p in sorted(outbox.iterdir())]
    assert len(received) == len(INJECTING_NAMES)
    for raw, recipients in received:
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        _, uid = user_of(parsed["Message-ID"])
        assert set(parsed.keys()) == HEADERS, sorted(parsed.keys())
        assert len(parsed.get_all("To") or []) == 1
        (to,) = parsed["To"].addresses
        assert to.addr_spec == emails[uid]
        head = raw.split(b"\r\n\r\n", 1)[0]
        for line in head.split(b"\r\n"):
            assert not re.match(rb"(?i)(bcc|cc|to|rcpt)\b.*attacker", line) or line.startswith(
                b"To:"
            ), line
        if recipients is not None:
            assert recipients == [emails[uid]], "one envelope recipient, the user"
    if backend == "smtp":
        everyone = [r for m in smtp_server.messages for r in m.recipients]
        assert not [r for r in everyone if "attacker" in r]


@pytest.mark.parametrize(
    "name",
    [
        "evil@attacker.example, other@attacker.example",  # first + last: long enough to fold
        "Zoë, evil@attacker.example, other@attacker.example",  # RFC 2047-encoded
        pytest.param(
            "=?utf-8?b?RXZlDQpCY2M6IGV2aWxAYXR0YWNrZXIuZXhhbXBsZQ==?=",
            id="a ready encoded-word hiding CR/LF",
        ),
    ],
)
def test_a_display_name_never_adds_addresses_to_the_to_header(
    sqlite_url: str, smtp_server: SmtpTestServer, name: str
) -> None:
    # Found against 4b3cdc4: policy.SMTP folded a long quoted display name without its
    # quotes, so the first name put its addresses in the To header's list. ab5c107 builds
    # the header without folding; this keeps it that way.
    env = cli_env(sqlite_url, smtp_server.url)
    assert run_cli("db", "migrate", env=env).returncode == 0
    query(
        sqlite_url,
        "INSERT INTO user (first_name, last_name, email, date_of_birth, status) "
        "VALUES (%s, %s, 'user1@example.com', '1990-06-01', 10)",
        name,
        name,
    )
    run = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert run.returncode == 0, run.stderr
    (message,) = smtp_server.messages
    assert message.recipients == ["user1@example.com"], "the envelope names the user alone"
    assert set(message.email.keys()) == HEADERS
    # Parsed the way a mail client reads it: structure first, encoded-words decoded inside.
    (to,) = message.email["To"].addresses
    assert to.addr_spec == "user1@example.com", f"To: {message.email['To']!r}"
    assert not any(unicodedata.category(c) == "Cc" for c in to.display_name), to.display_name


@pytest.mark.parametrize(
    "sender",
    ["birthday@example.com\r\nBcc: evil@attacker.example", "geburtstag@bücher.example"],
)
def test_an_unusable_sender_is_a_usage_error_not_a_lost_month(
    sqlite_url: str, tmp_path: Path, sender: str
) -> None:
    env = cli_env(sqlite_url, f"file://{tmp_path / 'outbox'}")
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "300", "--seed", "9", env=env).returncode == 0
    hostile = env | {"BATCHRUN_FROM": sender}
    run = run_cli("birthday", "--month", "2025-06", "--json", env=hostile)
    status = json.loads(run_cli("status", "--month", "2025-06", "--json", env=env).stdout)
    assert status["failed_permanent"] == 0, "the month is not written off"
    assert run.returncode == 2, run.stderr


# -- the outbox is owner-only ------------------------------------------------------------------


def test_the_default_outbox_is_owner_only_under_a_permissive_umask(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env |= {"BATCHRUN_DB": sqlite_url, "BATCHRUN_FROM": SENDER}  # BATCHRUN_MAIL: the default
    command = f"umask 022 && exec {sys.executable} -m batchrun"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", "-c", f"{command} {' '.join(args)}"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert cli("db", "migrate").returncode == 0
    assert cli("db", "seed", "--users", "300").returncode == 0
    run = cli("birthday", "--month", "2025-06", "--json")
    assert run.returncode == 0, run.stderr
    outbox = tmp_path / "outbox"
    assert stat.S_IMODE(outbox.stat().st_mode) == 0o700
    files = list(outbox.iterdir())
    assert len(files) == json.loads(run.stdout)["emails_sent"] > 0
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}


# -- the Lambda role grants what the code calls, and nothing else ------------------------------

# Every AWS API the code calls -> the IAM actions it needs. SES authorizes a raw sesv2
# SendEmail as either action (AWS CDK's own sendEmail grant names both).
IAM_ACTIONS = {
    "send_message_batch": {"sqs:SendMessage"},
    "receive_message": {"sqs:ReceiveMessage"},
    "delete_message_batch": {"sqs:DeleteMessage"},
    "change_message_visibility": {"sqs:ChangeMessageVisibility"},
    "get_queue_attributes": {"sqs:GetQueueAttributes"},
    "get_queue_url": {"sqs:GetQueueUrl"},
    "send_email": {"ses:SendEmail", "ses:SendRawEmail"},
    "get_account": {"ses:GetAccount"},
    "get_send_quota": {"ses:GetSendQuota"},
    "get_secret_value": {"secretsmanager:GetSecretValue"},
}
# What the platform needs beyond the code's own calls: logs, the secret's KMS key, a VPC.
PLATFORM = re.compile(r"^(logs:|kms:Decrypt$|ec2:)")
AWS_MODULES = [
    "queue/sqs.py",
    "mail/ses.py",
    "aws_secrets.py",
    "aws_lambda.py",
    "runtime/resources.py",
]
CLIENTS = {"client", "_client", "ses", "sqs", "secretsmanager"}


def _aws_calls() -> set[str]:
    calls: set[str] = set()
    for name in AWS_MODULES:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = node.func.value
            owner = receiver.attr if isinstance(receiver, ast.Attribute) else None
            owner = receiver.id if isinstance(receiver, ast.Name) else owner
            if owner in CLIENTS and node.func.attr not in {"close", "meta"}:
                calls.add(node.func.attr)
    return calls


def _granted() -> set[str]:
    template, problems = decode(str(ROOT / "deploy" / "template.yaml"))
    assert not problems and template is not None
    actions: set[str] = set()
    for policy in template["Resources"]["FunctionRole"]["Properties"]["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            if "Fn::If" in statement:
                statement = statement["Fn::If"][1]
            listed = statement["Action"]
            actions |= {listed} if isinstance(listed, str) else set(listed)
    return actions


def test_the_lambda_role_grants_exactly_the_aws_calls_the_code_makes() -> None:
    calls = _aws_calls()
    unknown = calls - set(IAM_ACTIONS)
    assert not unknown, f"a new AWS call: add its IAM action here and to the template: {unknown}"
    needed = set().union(*(IAM_ACTIONS[c] for c in calls))
    granted = _granted()
    assert needed <= granted, f"the code calls what the role does not grant: {needed - granted}"
    unused = {a for a in granted - needed if not PLATFORM.match(a)}
    assert not unused, f"granted but never called: {unused}"

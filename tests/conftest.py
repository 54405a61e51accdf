"""Fixtures: real servers started once per session, clean state handed out per test.

MySQL: the server named by BATCHRUN_TEST_MYSQL_URL (default: MariaDB on 127.0.0.1:3306,
root, empty password). Each test gets its own database, dropped afterwards. Without a
server the MySQL tests are skipped with one line saying how to run them; under CI
(CI=true) an unreachable server fails the run instead.

PostgreSQL: the same, with the server named by BATCHRUN_TEST_POSTGRES_URL (default:
127.0.0.1:5432, role postgres, trust authentication).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pymysql
import pytest
from support.aws_server import MotoServer
from support.http_server import GrantsTestServer
from support.smtp_server import SmtpTestServer

from batchrun.db import Store, connect
from batchrun.db.sqlite import sqlite_path
from batchrun.db.store import Scope
from batchrun.jobs.birthday import Birthday, demo
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.period import Period
from batchrun.queue.base import from_url as queue_from_url
from batchrun.runtime import Runtime
from batchrun.settings import Settings

MYSQL_URL = os.environ.get("BATCHRUN_TEST_MYSQL_URL", "mysql://root:@127.0.0.1:3306/")
POSTGRES_URL = os.environ.get("BATCHRUN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ROOT = Path(__file__).resolve().parent.parent


def mysql_connect(
    url: str | None = None, database: str | None = None
) -> pymysql.connections.Connection[Any]:
    """An autocommit pymysql connection to ``url`` (default: the test server, no database);
    ``database`` overrides the URL's own."""
    parts = urlsplit(url or MYSQL_URL)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database or parts.path.lstrip("/") or None,
        autocommit=True,
        connect_timeout=5,
        charset="utf8mb4",
    )


@pytest.fixture(scope="session")
def mysql_server() -> str:
    """The server's base URL; skips (or fails under CI) when it cannot be reached."""
    try:
        mysql_connect().close()
    except pymysql.err.MySQLError as exc:
        message = (
            f"MySQL not reachable at {MYSQL_URL} ({exc}); start MariaDB or set "
            "BATCHRUN_TEST_MYSQL_URL to run the MySQL tests"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return MYSQL_URL


@pytest.fixture
def mysql_url(mysql_server: str) -> Iterator[str]:
    """A fresh, empty database for this test."""
    name = f"batchrun_t_{uuid.uuid4().hex[:12]}"
    conn = mysql_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        parts = urlsplit(mysql_server)
        yield f"mysql://{parts.netloc}/{name}"
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def pg_connect(url: str | None = None, database: str | None = None) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection to ``url`` (default: the test server's ``postgres``
    database); ``database`` overrides the URL's own."""
    parts = urlsplit(url or POSTGRES_URL)
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname=database or parts.path.lstrip("/") or "postgres",
        autocommit=True,
        connect_timeout=5,
    )


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The server's base URL; skips (or fails under CI) when it cannot be reached."""
    try:
        pg_connect().close()
    except psycopg.Error as exc:
        message = (
            f"PostgreSQL not reachable at {POSTGRES_URL} ({str(exc).strip()}); start it or set "
            "BATCHRUN_TEST_POSTGRES_URL to run the PostgreSQL tests"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return POSTGRES_URL


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database for this test (CREATE DATABASE takes some 20 ms here)."""
    name = f"batchrun_t_{uuid.uuid4().hex[:12]}"
    conn = pg_connect()
    try:
        conn.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(postgres_server)
        yield f"postgresql://{parts.netloc}/{name}"
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'batchrun.db'}"


@pytest.fixture(params=["sqlite", "mysql", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The same test against a SQLite file, a real MySQL/MariaDB database and a real
    PostgreSQL one."""
    fixture = "postgres_url" if request.param == "postgresql" else f"{request.param}_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A migrated, empty store."""
    database = await connect(db_url, create=True)
    s = Store(database)
    await s.migrate([Birthday()])
    try:
        yield s
    finally:
        await database.close()


@pytest.fixture(scope="session")
def smtp_server_session() -> Iterator[SmtpTestServer]:
    with SmtpTestServer() as server:
        yield server


@pytest.fixture
def smtp_server(smtp_server_session: SmtpTestServer) -> SmtpTestServer:
    smtp_server_session.reset()
    return smtp_server_session


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoServer]:
    """moto's SQS/SES/SNS server, one per test module (tests call ``reset()`` first)."""
    # moto's server runs in this process: its request log would reach the CLI's handler
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with MotoServer() as server:
        yield server


@pytest.fixture
def aws_env(moto_server: MotoServer) -> dict[str, str]:
    """The environment of a client of the (reset) moto server."""
    moto_server.reset()
    return moto_server.env


@pytest.fixture(scope="session")
def grants_server_session() -> Iterator[GrantsTestServer]:
    with GrantsTestServer() as server:
        yield server


@pytest.fixture
def grants(grants_server_session: GrantsTestServer) -> GrantsTestServer:
    """The grants API double (examples/credits' HTTP API), reset."""
    grants_server_session.reset()
    return grants_server_session


@pytest.fixture(params=["mysql", "postgresql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """A fresh database on a real server: MariaDB, then PostgreSQL."""
    fixture = "postgres_url" if request.param == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    """Settings for a test: short leases and backoffs so waits stay short."""

    def make(db_url: str, **overrides: Any) -> Settings:
        base = Settings(
            db_url=db_url,
            mail_url=f"file://{tmp_path / 'outbox'}",
            lease_s=2.0,
            retry_base_s=0.0,
            mail_timeout_s=2.0,
            sender="birthday@example.com",
        )
        return base.with_overrides(**overrides)

    return make


@pytest.fixture
async def make_job(
    make_settings: Callable[..., Settings],
) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``await make_job(db_url, mail_url=...)`` -> a Runtime on its own pool."""
    opened: list[Any] = []

    async def make(db_url: str, **overrides: Any) -> Runtime:
        settings = make_settings(db_url, **overrides)
        database = await connect(settings.db_url, pool_size=4)
        mailer = mailer_from_url(settings.mail_url, timeout=settings.mail_timeout_s, pool_size=8)
        queue = queue_from_url(
            settings.retry_queue_url, db=database, max_receives=settings.max_receives
        )
        opened.append((database, mailer))
        return Runtime(Birthday(), Store(database), mailer, queue, settings)

    yield make
    for database, mailer in opened:
        await mailer.close()
        await database.close()


def table_digest(db_url: str, tables: list[str] | None = None) -> dict[str, str]:
    """A digest of every row of every table (not CHECKSUM TABLE: see DESIGN.md's traps)."""
    digests: dict[str, str] = {}
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            names = tables or [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"
                )
            ]
            for name in names:
                rows = conn.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall()
                digests[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
        finally:
            conn.close()
        return digests
    if db_url.startswith("postgres"):
        with pg_connect(db_url) as pg:
            names = tables or [
                str(r[0])
                for r in pg.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() ORDER BY table_name"
                ).fetchall()
            ]
            for name in names:
                rows = pg.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall()
                digests[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
        return digests
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            if tables is None:
                cur.execute("SHOW TABLES")
                tables = sorted(r[0] for r in cur.fetchall())
            for name in tables:
                cur.execute(f"SELECT * FROM `{name}` ORDER BY 1")
                digests[name] = hashlib.sha256(repr(cur.fetchall()).encode()).hexdigest()
    finally:
        conn.close()
    return digests


def query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run one inspection query synchronously (tests only)."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            rows = [tuple(r) for r in conn.execute(sql.replace("%s", "?"), args).fetchall()]
            conn.commit()
            return rows
        finally:
            conn.close()
    if db_url.startswith("postgres"):
        with pg_connect(db_url) as pg:
            cur = pg.execute(pg_sql(sql), args or None)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args or None)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


_PG_USER = re.compile(r"\b(FROM|JOIN|UPDATE|INTO|TABLE)\s+user\b", re.IGNORECASE)


def pg_sql(sql: str) -> str:
    """A test's MySQL-style inspection query for PostgreSQL: `quoted` names in double
    quotes, the ``user`` table quoted (a reserved word there), and ``birth_month`` the
    expression the index is built on (PostgreSQL has no such column: no table rewrite)."""
    sql = sql.replace("`", '"')
    sql = _PG_USER.sub(lambda m: f'{m[1]} "user"', sql)
    return re.sub(r"\bbirth_month\b", "EXTRACT(MONTH FROM date_of_birth)", sql)


async def seed_users(store: Store, count: int, *, seed: int = 1, force: bool = False) -> int:
    """The birthday job's demo users (``batchrun db seed``)."""
    return await demo.seed_users(store.jobdb, count, seed=seed, force=force)


async def status_of(runtime: Runtime, period: Period, problems: int = 50) -> SimpleNamespace:
    """What `batchrun status` reports for the birthday job: cards, emails_sent, pending ..."""
    counts = await runtime.status("birthday", period, problems=problems)
    return SimpleNamespace(emails_sent=counts["succeeded"], **counts)


def birthday_scope(year: int = 2025, month: int = 6) -> Scope:
    """The ledger scope of the birthday job's month."""
    return Scope("birthday", f"{year:04d}", f"{year:04d}-{month:02d}")


async def seed(store: Store, count: int, *, seed: int = 7) -> None:
    await seed_users(store, count, seed=seed)


def eligible_ids(db_url: str, month: int) -> set[int]:
    """Users the job must reach: active, born in the month, with an address."""
    rows = query(
        db_url,
        "SELECT id FROM user WHERE birth_month = %s AND status = 10 AND email IS NOT NULL",
        month,
    )
    return {int(r[0]) for r in rows}


def card_counts(db_url: str, year: int) -> dict[int, int]:
    """user id -> number of this job's cards for ``year``."""
    rows = query(
        db_url,
        "SELECT idempotency_key FROM gift_card WHERE idempotency_key LIKE %s",
        f"birthday:{year}:%",
    )
    counts: dict[int, int] = {}
    for (key,) in rows:
        uid = int(str(key).rsplit(":", 1)[1])
        counts[uid] = counts.get(uid, 0) + 1
    return counts


def run_cli(
    *args: str,
    env: dict[str, str],
    timeout: float = 60,
    check: bool = False,
    sigterm_after: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batchrun`` in a subprocess with ``env`` added to a clean environment.

    ``sigterm_after``: send SIGTERM after that many seconds (a worker runs until then).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    if sigterm_after is not None:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchrun", *args],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            out, err = process.communicate(timeout=sigterm_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return subprocess.run(
        [sys.executable, "-m", "batchrun", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        cwd=ROOT,
    )

"""Fixtures only (helper functions are in tests/support/): real servers started once per
session, clean state handed out per test.

MySQL: the server named by BATCHRUN_TEST_MYSQL_URL (default: MariaDB on 127.0.0.1:3306,
root, empty password). Each test gets its own database, dropped afterwards. Without a
server the MySQL tests are skipped with one line saying how to run them; under CI
(CI=true) an unreachable server fails the run instead.

PostgreSQL: the same, with the server named by BATCHRUN_TEST_POSTGRES_URL (default:
127.0.0.1:5432, role postgres, trust authentication).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pymysql
import pytest
from support import IN_CI
from support.aws_server import MotoServer
from support.db import MYSQL_URL, POSTGRES_URL, mysql_connect, pg_connect
from support.http_server import GrantsTestServer
from support.smtp_server import SmtpTestServer

from batchrun.db import Store, connect
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.queue.base import from_url as queue_from_url
from batchrun.runtime import Runtime, resources
from batchrun.settings import Settings

# support.checks holds asserts: rewritten like a test module's (it is imported later).
pytest.register_assert_rewrite("support.checks")


@pytest.fixture(autouse=True)
def _schema_unchecked() -> Iterator[None]:
    """Each test starts with no schema found migrated in this process (a warm Lambda's
    memory, ``runtime/resources.py``): a test that changes its schema is checked anew."""
    resources._schema_checked.clear()
    yield


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


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    """The CLI installs a rich handler on the root logger; leave it as we found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A CLI environment: a SQLite database and a file outbox inside this test's
    directory (modules that need another override it)."""
    return {
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'cli.db'}",
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_LEASE_S": "2",
    }

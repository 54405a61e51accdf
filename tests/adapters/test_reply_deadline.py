"""The reply deadline (``?reply_timeout=``) on a real server: a statement it cuts short,
at any moment of its reply, is a DatabaseError (a lost connection), never the driver's own
error about the connection closed under it; and on MariaDB the statement is stopped on the
server too."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from support.cli import run_cli
from support.db import query
from support.tcp_proxy import TcpProxy

from batchrun.db.base import connect
from batchrun.errors import DatabaseError

BIG_REPLY = {"mysql": "SELECT REPEAT('x', 3000000)", "postgresql": "SELECT repeat('x', 3000000)"}


async def test_a_reply_cut_at_any_moment_is_a_database_error(
    server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With deadlines around the time a 3 MB reply takes, the timer fires before, during
    and after it arrives: aiomysql's reader or asyncpg's protocol, gone under the driver,
    escaped as AttributeError."""
    caplog.set_level(logging.ERROR)
    dialect = "postgresql" if server_url.startswith("postgres") else "mysql"
    outcomes: dict[str, int] = {}
    for seconds in (0.002, 0.005, 0.01, 0.02):
        # Connected first: a login bounded by a few milliseconds fails on a loaded machine
        # (it is bounded by reply_timeout too), and the statements are what is tested here.
        database = await connect(server_url)
        database.reply_timeout_s = seconds  # type: ignore[attr-defined]
        try:
            for _ in range(5):
                try:
                    await database.fetch_sql(BIG_REPLY[dialect], ())
                    outcomes["ok"] = outcomes.get("ok", 0) + 1
                except DatabaseError:
                    outcomes["cut"] = outcomes.get("cut", 0) + 1
        finally:
            await database.close()
    assert outcomes.get("cut", 0) > 0, outcomes  # the deadline did cut some


async def test_a_statement_cut_by_the_deadline_is_stopped_on_mariadb(mysql_url: str) -> None:
    database = await connect(f"{mysql_url}?reply_timeout=0.5")
    try:
        with pytest.raises(DatabaseError, match=r"no reply in 0\.5 s"):
            await database.fetch_sql("SELECT SLEEP(20) AS asleep", ())
    finally:
        await database.close()
    deadline = time.monotonic() + 3
    sleeping = [1]
    while sleeping and time.monotonic() < deadline:
        sleeping = query(
            mysql_url,
            "SELECT id FROM information_schema.processlist WHERE info LIKE "
            "'SELECT SLEEP(20) AS asleep%%' AND db = DATABASE() AND id <> CONNECTION_ID()",
        )
        time.sleep(0.1)
    assert sleeping == [], "the statements the deadline cut go on on the server"


def test_a_login_that_gets_no_answer_is_one_line_not_a_hang(mysql_url: str) -> None:
    """A proxy (or server) that takes the connection and then says nothing held aiomysql's
    login for good: its connect_timeout covers the TCP connect only."""
    with TcpProxy("127.0.0.1", 3306) as proxy:
        proxy.silence(b"READ-COMMITTED")  # the session's init_command, at login
        ran = run_cli("status", env={"BATCHRUN_DB": proxy.url_for(mysql_url) + "?reply_timeout=2"})
    assert proxy.silenced == 1
    assert ran.returncode == 1, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "no answer in 2 s" in lines[0], ran.stderr


async def test_a_new_connection_whose_login_gets_no_answer_is_replaced(
    mysql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The pool logs a new connection in while it is locked: one silent login held every
    statement of the process. Now the wait ends after reply_timeout and the statement goes
    on another connection."""
    with TcpProxy("127.0.0.1", 3306) as proxy:
        database = await connect(proxy.url_for(mysql_url) + "?reply_timeout=1")
        try:
            proxy.silence(b"READ-COMMITTED")  # the next connection's login
            busy = asyncio.create_task(database.fetch_sql("SELECT SLEEP(0.5)", ()))
            await asyncio.sleep(0.1)  # the first connection is taken: the next is new
            rows = await asyncio.wait_for(database.fetch_sql("SELECT 41 + 1", ()), 20)
            await busy
        finally:
            await database.close()
    assert rows == [(42,)]
    assert proxy.silenced == 1
    assert "no connection in 1 s" in caplog.text

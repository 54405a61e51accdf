"""The reply deadline (``?reply_timeout=``) on a real server: a statement it cuts short,
at any moment of its reply, is a DatabaseError (a lost connection), never the driver's own
error about the connection closed under it; and on MariaDB the statement is stopped on the
server too."""

from __future__ import annotations

import logging
import time

import pytest
from support.db import query

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
        database = await connect(f"{server_url}?reply_timeout={seconds}")
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

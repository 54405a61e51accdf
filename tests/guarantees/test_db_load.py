"""`--max-db-load N`: a run pauses taking pages while the server is busy, then completes.

The load is real: sessions running `SELECT SLEEP(3)` keep MariaDB's Threads_running above
N; the run waits them out (`db_paused_s`), resumes and finishes every user. On SQLite the
option is accepted and never pauses.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import Result
from support.birthday import eligible_ids
from support.db import mysql_connect
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.errors import ConfigError
from batchrun.settings import Settings

SLEEP_S = 3
USERS = 400


def invoke(db_url: str, outbox: Path, *args: str, **env: str) -> Result:
    """The CLI in-process on ``db_url``, mail to a file outbox, a wide stderr."""
    full: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    full.update({"COLUMNS": "400", "NO_COLOR": "1", "BATCHRUN_DB": db_url})
    full.update({"BATCHRUN_MAIL": f"file://{outbox}", "BATCHRUN_LEASE_S": "5"})
    full.update(env)
    return CliRunner().invoke(app, list(args), env=full)


def seeded(db_url: str, outbox: Path) -> None:
    for args in (("db", "migrate"), ("db", "seed", "--users", str(USERS))):
        done = invoke(db_url, outbox, *args)
        assert done.exit_code == 0, done.output


def threads_running(db_url: str) -> int:
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_running'")
            return int(cur.fetchone()[1])  # type: ignore[index]
    finally:
        conn.close()


def sleeper(db_url: str, ready: threading.Event) -> None:
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            ready.set()
            cur.execute(f"SELECT SLEEP({SLEEP_S})")
    finally:
        conn.close()


def test_a_run_pauses_while_the_server_is_busy_then_completes(
    mysql_url: str, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    seeded(mysql_url, outbox)
    # Above what the server runs without us (other sessions may be at work on it too).
    limit = min(threads_running(mysql_url) for _ in range(5)) + 3
    sessions = [threading.Event() for _ in range(limit + 2)]
    threads = [
        threading.Thread(target=sleeper, args=(mysql_url, ready), daemon=True) for ready in sessions
    ]
    for thread in threads:
        thread.start()
    for ready in sessions:
        assert ready.wait(5)
    deadline = time.monotonic() + 2
    while threads_running(mysql_url) <= limit:
        assert time.monotonic() < deadline, "the sleeping sessions never showed as running"
        time.sleep(0.05)

    started = time.monotonic()
    done = invoke(
        mysql_url,
        outbox,
        "birthday",
        "--month",
        "2025-06",
        "--page-size",
        "50",
        "--max-db-load",
        str(limit),
        "--json",
    )
    took = time.monotonic() - started
    for thread in threads:
        thread.join(SLEEP_S + 5)

    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    expected = eligible_ids(mysql_url, 6)
    assert expected and summary["eligible"] == summary["succeeded"] == len(expected)
    assert summary["failed"] == summary["left_pending"] == 0
    assert summary["db_paused_s"] > 1.0  # it waited for the sleeping sessions
    assert summary["db_paused_s"] <= took
    assert len(list(outbox.iterdir())) == len(expected)
    assert done.stderr.count("pausing new pages") == 1  # the pause is logged once
    assert f"above --max-db-load {limit}" in done.stderr


def test_without_load_the_run_never_pauses(mysql_url: str, tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    seeded(mysql_url, outbox)
    done = invoke(
        mysql_url,
        outbox,
        "birthday",
        "--month",
        "2025-06",
        "--json",
        BATCHRUN_MAX_DB_LOAD="1000",  # from the environment this time
    )
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    assert summary["db_paused_s"] == 0.0
    assert summary["succeeded"] == len(eligible_ids(mysql_url, 6))
    assert "pausing" not in done.stderr


def test_sqlite_accepts_max_db_load_and_does_nothing(sqlite_url: str, tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    seeded(sqlite_url, outbox)
    done = invoke(sqlite_url, outbox, "birthday", "--month", "2025-06", "--max-db-load", "1")
    assert done.exit_code == 0, done.output
    assert "db paused s" in done.stdout  # the summary table's row
    dry = invoke(
        sqlite_url, outbox, "birthday", "--month", "2025-07", "--dry-run", "--json",
        BATCHRUN_MAX_DB_LOAD="1",
    )  # fmt: skip
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["db_paused_s"] == 0.0


@pytest.mark.parametrize("raw", ["0", "-2", "many"])
def test_a_bad_max_db_load_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="BATCHRUN_MAX_DB_LOAD"):
        Settings.from_env({"BATCHRUN_MAX_DB_LOAD": raw})
    assert Settings.from_env({"BATCHRUN_MAX_DB_LOAD": "8"}).max_db_load == 8
    assert Settings.from_env({}).max_db_load is None


def test_max_db_load_zero_is_a_usage_error(sqlite_url: str, tmp_path: Path) -> None:
    done = invoke(sqlite_url, tmp_path / "outbox", "birthday", "--max-db-load", "0")
    assert done.exit_code == 2

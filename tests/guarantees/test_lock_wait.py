"""Lock waits and terminated backends: a run goes on.

- Another session holds one of the run's ledger rows ``SELECT … FOR UPDATE`` for 40 s,
  far past batchrun's lock wait timeout (2 s a try) and its 15 s lease: the heartbeat
  cannot renew and fences the claims, the outcome write waits and goes again, and the run
  ends with exit 0 or 3 and its JSON summary, no traceback (it exited 1 after 22 s with
  five tracebacks and nothing on stdout).
- On SQLite, another connection holds the file's write lock (``BEGIN IMMEDIATE``) for
  12 s, past the 5 s busy timeout: exit 0 or 3, the month done (it exited 1 on "database
  is locked").
- PostgreSQL backends terminated every 0.3 s (``pg_terminate_backend``) during a run: exit
  0 or 3, no traceback, and the month completes after a rerun and a retry (3 of 4 runs
  ended with exit 1 and asyncpg's ``InternalClientError: cannot switch to state``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.birthday import eligible_ids, want_ids
from support.checks import assert_month_complete, assert_one_card_each
from support.cli import cli_env, run_cli, spawn, wait_until
from support.db import mysql_connect, pg_connect, query
from support.smtp_server import SmtpTestServer

HOLD_S = 40.0
CONCURRENCY = 5


def seeded(url: str, env: dict[str, str], users: int) -> None:
    for step in (("db", "migrate"), ("db", "seed", "--users", str(users), "--seed", "41")):
        done = run_cli(*step, env=env)
        assert done.returncode == 0, done.stderr


PENDING = (
    "SELECT entity_id FROM batchrun_ledger WHERE state = 0 AND owner IS NOT NULL "
    "ORDER BY entity_id LIMIT 1 OFFSET %s"
)
LOCK = (
    "SELECT state, owner FROM batchrun_ledger WHERE job = 'birthday' "
    "AND once_key = '2025' AND entity_id = %s FOR UPDATE"
)


def hold_row(url: str, skip: int, seconds: float) -> tuple[int, int, str | None]:
    """Lock one ledger row the run is about to work on FOR UPDATE, in a transaction, for
    ``seconds``; (its id, and the state and owner it had when the lock was taken).

    The run works its claims in id order, ``concurrency`` at a time: the pending row
    ``skip`` places after the lowest is taken within moments, and its outcome write is
    the one the lock stops (the heartbeat's too: its id range covers the row).
    """
    if url.startswith("postgres"):
        with pg_connect(url) as pg:
            pg.autocommit = False
            found = pg.execute(PENDING, (skip,)).fetchone()
            assert found is not None
            row = pg.execute(LOCK, (found[0],)).fetchone()
            time.sleep(seconds)
            pg.rollback()
    else:
        conn = mysql_connect(url)
        try:
            conn.begin()
            with conn.cursor() as cur:
                cur.execute(PENDING, (skip,))
                found = cur.fetchone()
                assert found is not None
                cur.execute(LOCK, (found[0],))
                row = cur.fetchone()
            time.sleep(seconds)
            conn.rollback()
        finally:
            conn.close()
    assert row is not None
    return int(found[0]), int(row[0]), row[1]


def finished(run: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = run.communicate(timeout=120)
    assert out.strip(), f"no JSON on stdout (exit {run.returncode}): {err}"
    data: dict[str, Any] = json.loads(out)
    return run.returncode, data, err


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_ledger_row_locked_for_40s_does_not_end_the_run(
    server_url: str, smtp_server: SmtpTestServer
) -> None:
    env = cli_env(server_url, smtp_server.url, BATCHRUN_LEASE_S="15")
    seeded(server_url, env, 3000)
    want = want_ids(server_url)
    smtp_server.set_latency(0.05)
    run = spawn(
        "birthday",
        "--month",
        "2025-06",
        "--concurrency",
        str(CONCURRENCY),
        "--json",
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        assert wait_until(lambda: len(smtp_server.messages) >= 20, timeout=30, step=0.01)
        target, state, owner = hold_row(server_url, 2 * CONCURRENCY, HOLD_S)
        still_running = run.poll() is None
        code, data, err = finished(run)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert (state, owner is not None) == (0, True), "the row was the run's, not finished"
    assert still_running, f"the run outlasted the lock: {err}"
    assert code in (0, 3), f"exit {code}: {err}"
    assert "Traceback" not in err, err
    assert "error" not in data, data
    assert data["eligible"] == len(eligible_ids(server_url, 6))
    per_user = smtp_server.sends_per_user(2025)
    assert want <= set(per_user) or code == 3, "done, or queued for retry"
    assert query(server_url, "SELECT state FROM batchrun_ledger WHERE entity_id = %s", target)[0][
        0
    ] in (1, 3), "the locked row was finished once the lock went"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_sqlite_write_lock_held_past_the_busy_timeout_does_not_end_the_run(
    sqlite_url: str, smtp_server: SmtpTestServer
) -> None:
    env = cli_env(sqlite_url, smtp_server.url, BATCHRUN_LEASE_S="15")
    seeded(sqlite_url, env, 2400)
    want = want_ids(sqlite_url)
    smtp_server.set_latency(0.05)
    run = spawn(
        "birthday",
        "--month",
        "2025-06",
        "--concurrency",
        "2",
        "--json",
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        assert wait_until(lambda: len(smtp_server.messages) >= 10, timeout=30, step=0.01)
        holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the write lock: every writer waits behind it
        before = len(smtp_server.messages)
        time.sleep(12.0)
        holder.execute("ROLLBACK")
        holder.close()
        still_running = run.poll() is None
        code, data, err = finished(run)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert still_running, f"the run outlasted the lock: {err}"
    assert before < len(want), "the lock was taken mid-month"
    assert code in (0, 3), f"exit {code}: {err}"
    assert "Traceback" not in err and "error" not in data, err
    per_user = smtp_server.sends_per_user(2025)
    assert max(per_user.values()) == 1, "one email each: the lock lost no claim"
    if code == 0:
        assert set(per_user) == want
        assert_one_card_each(sqlite_url, want)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_statement_timeout_shorter_than_the_lock_wait_does_not_end_the_run(
    server_url: str, smtp_server: SmtpTestServer
) -> None:
    """The database's statement time limit (1 s: PostgreSQL's statement_timeout, a MariaDB
    user's MAX_STATEMENT_TIME) cancels batchrun's outcome write before its own 2 s lock
    wait would: that ended the run (exit 1) with emails accepted and not recorded, which
    a rerun sent again. It goes again, as a lock wait does."""
    env = cli_env(server_url, smtp_server.url, BATCHRUN_LEASE_S="15")
    seeded(server_url, env, 3000)
    parts = urlsplit(server_url)
    database = parts.path.lstrip("/")
    user = ""
    if server_url.startswith("postgres"):
        with pg_connect() as admin:
            admin.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '1s'")
    else:
        user = f"brt_{database[-12:]}"
        with mysql_connect(server_url) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%' WITH MAX_STATEMENT_TIME 1")
            cur.execute(f"GRANT ALL ON `{database}`.* TO '{user}'@'%'")
        env = env | {"BATCHRUN_DB": f"mysql://{user}@{parts.hostname}:{parts.port}/{database}"}
    want = want_ids(server_url)
    smtp_server.set_latency(0.05)
    run = spawn(
        "birthday", "--month", "2025-06", "--concurrency", str(CONCURRENCY), "--json",
        env=env, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert wait_until(lambda: len(smtp_server.messages) >= 20, timeout=30, step=0.01)
        hold_row(server_url, 2 * CONCURRENCY, 6.0)
        code, data, err = finished(run)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert code in (0, 3) and "error" not in data, f"exit {code}: {err}"
    try:
        rerun = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
    finally:
        if user:
            with mysql_connect(server_url) as conn, conn.cursor() as cur:
                cur.execute(f"DROP USER '{user}'@'%'")
    assert rerun.returncode in (0, 3), rerun.stderr
    per_user = smtp_server.sends_per_user(2025)
    assert max(per_user.values()) == 1, "no email sent twice"
    assert set(per_user) <= want
    assert_one_card_each(server_url, set(per_user))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_dbas_kill_query_on_a_waiting_statement_does_not_end_the_run(
    mysql_url: str, smtp_server: SmtpTestServer
) -> None:
    """KILL QUERY (1317) of batchrun's outcome write, waiting on a row another session
    holds: the run ended with exit 1 and emails sent and not recorded. The killed
    statement was undone, so it goes again, as a lock wait does."""
    env = cli_env(mysql_url, smtp_server.url, BATCHRUN_LEASE_S="15")
    seeded(mysql_url, env, 3000)
    database = urlsplit(mysql_url).path.lstrip("/")
    want = want_ids(mysql_url)
    smtp_server.set_latency(0.05)
    kills: list[int] = []
    done = threading.Event()

    def kill_waiting() -> None:
        with mysql_connect(mysql_url) as conn, conn.cursor() as cur:
            while not done.wait(0.3):
                cur.execute(
                    "SELECT id FROM information_schema.processlist WHERE db = %s AND "
                    "command = 'Query' AND time >= 1 AND info LIKE 'UPDATE%%'",
                    (database,),
                )
                for (pid,) in cur.fetchall():
                    with contextlib.suppress(Exception):
                        cur.execute(f"KILL QUERY {int(pid)}")
                        kills.append(int(pid))

    run = spawn(
        "birthday", "--month", "2025-06", "--concurrency", str(CONCURRENCY), "--json",
        env=env, stdout=subprocess.PIPE,
    )  # fmt: skip
    killer = threading.Thread(target=kill_waiting)
    try:
        assert wait_until(lambda: len(smtp_server.messages) >= 20, timeout=30, step=0.01)
        killer.start()
        hold_row(mysql_url, 2 * CONCURRENCY, 6.0)
        code, data, err = finished(run)
    finally:
        done.set()
        if killer.is_alive():
            killer.join()
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert kills, "a waiting statement was killed"
    assert code in (0, 3) and "error" not in data, f"exit {code}: {err}"
    rerun = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
    assert rerun.returncode in (0, 3), rerun.stderr
    per_user = smtp_server.sends_per_user(2025)
    assert max(per_user.values()) == 1 and set(per_user) <= want


def lock_table(url: str, table: str, seconds: float, taken: threading.Event) -> None:
    """Hold ``table`` ACCESS EXCLUSIVE in a transaction for ``seconds``."""
    with pg_connect(url) as pg:
        pg.autocommit = False
        pg.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        taken.set()
        time.sleep(seconds)
        pg.rollback()


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("table", ["gift_card", "batchrun_run"])
def test_a_lock_on_an_application_table_or_the_run_history_delays_a_run(
    postgres_url: str, smtp_server: SmtpTestServer, table: str
) -> None:
    """A lock held 9 s on the job's own table (the cards ``prepare`` inserts) or on the run
    history: the run ended with exit 1 after some 8 s (three lock waits); it waits."""
    env = cli_env(postgres_url, smtp_server.url)
    seeded(postgres_url, env, 1200)
    want = want_ids(postgres_url)
    taken = threading.Event()
    holder = threading.Thread(target=lock_table, args=(postgres_url, table, 9.0, taken))
    holder.start()
    try:
        assert taken.wait(10)
        started = time.monotonic()
        done = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
        waited = time.monotonic() - started
    finally:
        holder.join()
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "waits for a lock" in done.stderr, done.stderr
    assert waited > 5, "the lock was in the way"
    assert set(smtp_server.sends_per_user(2025)) == want
    assert_one_card_each(postgres_url, want)
    runs = json.loads(run_cli("runs", "--json", env=env).stdout)
    assert [r["outcome"] for r in runs] == ["ok"], runs


def terminate_backends(
    database: str, stop: threading.Event, every_s: float, killed: list[int]
) -> None:
    """``pg_terminate_backend`` every connection to ``database`` every ``every_s`` until
    ``stop``; adds how many to ``killed``."""
    with pg_connect() as admin:
        while not stop.wait(every_s):
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
            killed.append(sum(1 for r in rows if r[0]))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_postgresql_backends_terminated_every_300ms_during_runs(
    postgres_url: str, smtp_server: SmtpTestServer
) -> None:
    database = urlsplit(postgres_url).path.lstrip("/")
    env = cli_env(postgres_url, smtp_server.url)
    seeded(postgres_url, env, 3000)
    want = want_ids(postgres_url)
    eligible = eligible_ids(postgres_url, 6)
    codes = []
    killed: list[int] = []
    for year in (2025, 2026):
        smtp_server.reset()
        smtp_server.set_latency(0.01)
        stop = threading.Event()
        killer = threading.Thread(target=terminate_backends, args=(database, stop, 0.3, killed))
        killer.start()
        try:
            run = run_cli(
                "birthday", "--month", f"{year}-06", "--concurrency", "10", "--json", env=env
            )
        finally:
            stop.set()
            killer.join(10)
        codes.append(run.returncode)
        assert run.returncode in (0, 3), f"{year}: exit {run.returncode}: {run.stderr}"
        assert "Traceback" not in run.stderr, run.stderr
        assert json.loads(run.stdout)["job"] == "birthday"

        smtp_server.set_latency(0)
        rerun = run_cli("birthday", "--month", f"{year}-06", "--json", env=env, timeout=120)
        assert rerun.returncode in (0, 3), rerun.stderr
        drained = run_cli("retry", "--json", env=env, timeout=120)
        assert drained.returncode == 0, drained.stderr
        assert_month_complete(
            postgres_url,
            smtp_server,
            year=year,
            want=want,
            skipped=len(eligible - want),
            max_duplicates=10,
            where=f"year {year}",
        )
    print(f"pg_terminate_backend: {sum(killed)} backends terminated, runs exited {codes}")
    assert sum(killed) >= 5, "the runs' backends were terminated"

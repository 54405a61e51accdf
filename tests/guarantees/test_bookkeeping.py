"""Bookkeeping: what the retry queue,
the ledger, ``status`` and the exit codes say after failures, limits, outages and signals.

Each test runs ``python -m batchrun`` as a subprocess, against a real SQLite file or MariaDB
database, a real SMTP server (``smtp_server.py``) or a closed port for a dead one. Counts
are checked three ways that must agree: the command's own JSON, ``status --json``, and the
ledger and queue tables read directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.birthday import card_counts, eligible_ids, seed_users
from support.cli import run_cli
from support.db import query
from support.smtp_server import SmtpTestServer

from batchrun.db import Store, connect
from batchrun.db.sqlite import sqlite_path
from batchrun.db.store import State
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import valid_address
from batchrun.queue.base import QueueMessage

SENDER = "birthday@example.com"
MONTH = "2025-06"
LIMIT = 150
UNAVAILABLE = "421 4.3.2 Service not available"

pytestmark = pytest.mark.slow


# -- helpers -------------------------------------------------------------------------------


def cli_env(db_url: str, mail_url: str, **extra: str) -> dict[str, str]:
    """A batchrun subprocess's environment: this worktree's code, short leases and waits."""
    return {
        "PYTHONPATH": str(ROOT),
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": mail_url,
        "BATCHRUN_FROM": SENDER,
        "BATCHRUN_LEASE_S": "1",
        "BATCHRUN_RETRY_BASE_S": "0",
        "BATCHRUN_MAIL_TIMEOUT_S": "2",
        "COLUMNS": "400",  # rich wraps log lines at the terminal width; keep one per line
        **extra,
    }


@pytest.fixture(scope="module")
def dead_mail() -> Iterator[str]:
    """An SMTP URL whose server takes a session (the run's preflight checks that) and
    closes the channel (421) on every message: a mail backend that is down for sending.
    (A port nobody listens on is found by the preflight: exit 1 before any effect.)"""
    with SmtpTestServer(policy=lambda _rcpt, _n: UNAVAILABLE) as server:
        yield server.url


def spawn(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``python -m batchrun ARGS`` without waiting, its output captured."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    return subprocess.Popen(
        [sys.executable, "-m", "batchrun", *args],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Wait for ``process``; kill it if it outlives ``timeout``."""
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def wait_until(done: Callable[[], bool], *, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(step)
    return done()


def migrate_and_seed(db_url: str, users: int, seed: int) -> None:
    """The birthday schema and ``users`` demo users, in-process (faster than two CLI calls)."""

    async def go() -> None:
        database = await connect(db_url, create=True)
        try:
            store = Store(database)
            await store.migrate([Birthday()])
            await seed_users(store, users, seed=seed)
        finally:
            await database.close()

    asyncio.run(go())


def cli_json(*args: str, env: dict[str, str], code: int = 0, timeout: float = 60) -> Any:
    """Run a ``--json`` command, check its exit status, return its JSON."""
    result = run_cli(*args, "--json", env=env, timeout=timeout)
    assert result.returncode == code, f"{args}: exit {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def status(env: dict[str, str], *args: str) -> dict[str, Any]:
    data: dict[str, Any] = cli_json("status", *(args or ("--month", MONTH)), env=env)
    return data


def month_users(db_url: str) -> list[int]:
    """The month's selected users in id order (active, with an address, valid or not)."""
    return sorted(eligible_ids(db_url, 6))


def with_valid_address(db_url: str, ids: set[int]) -> set[int]:
    rows = query(db_url, "SELECT id, email FROM user WHERE birth_month = 6")
    return {int(uid) for uid, addr in rows if int(uid) in ids and valid_address(addr or "")}


def ledger(db_url: str, job: str = "birthday") -> dict[int, tuple[int, int]]:
    """entity id -> (state, attempts) for the job's rows."""
    rows = query(
        db_url, "SELECT entity_id, state, attempts FROM batchrun_ledger WHERE job = %s", job
    )
    return {int(uid): (int(state), int(attempts)) for uid, state, attempts in rows}


def in_state(db_url: str, state: State) -> set[int]:
    return {uid for uid, (s, _) in ledger(db_url).items() if s == int(state)}


def waiting_messages(db_url: str) -> Counter[tuple[str, int | None]]:
    """(kind, entity id) of every live message on the local queue."""
    rows = query(db_url, "SELECT body FROM batchrun_queue WHERE dead = 0")
    bodies = [json.loads(body) for (body,) in rows]
    return Counter((b["kind"], b.get("id")) for b in bodies)


def depths(db_url: str) -> tuple[int, int]:
    """(live, dead) messages on the local queue, as ``status`` counts them."""
    ((live, dead),) = query(
        db_url,
        "SELECT COALESCE(SUM(CASE WHEN dead = 0 THEN 1 ELSE 0 END), 0), "
        "COALESCE(SUM(CASE WHEN dead = 1 THEN 1 ELSE 0 END), 0) FROM batchrun_queue",
    )
    return int(live), int(dead)


def put_on_queue(db_url: str, body: str) -> None:
    now = int(time.time() * 1000)
    query(
        db_url,
        "INSERT INTO batchrun_queue (body, visible_at, receive_count, dead, created_at) "
        "VALUES (%s, %s, 0, 0, %s)",
        body,
        now,
        now,
    )


# -- 3 and 4: one retry message per user; --limit holds to the end --------------------------


def test_two_limited_runs_against_a_dead_mailer_then_one_retry(
    db_url: str, smtp_server: SmtpTestServer, dead_mail: str
) -> None:
    migrate_and_seed(db_url, 3000, seed=41)
    selected = month_users(db_url)
    assert len(selected) > LIMIT + 50, "the month must be clearly bigger than the limit"
    first = set(selected[:LIMIT])
    dead = cli_env(db_url, dead_mail)
    # Pages of 50: the breaker opens inside the first page, so the rest of the limit is
    # what a continuation (or the runs themselves) must account for.
    run = ("birthday", "--month", MONTH, "--limit", str(LIMIT), "--page-size", "50")
    for attempt in (1, 2):
        summary = cli_json(*run, env=dead, code=3)
        assert summary["emails_sent"] == 0, (attempt, summary)

    waiting = in_state(db_url, State.RETRYING)
    skipped = in_state(db_url, State.SKIPPED)
    assert waiting | skipped == set(ledger(db_url)) == first, "the limit's users, no others"
    messages = waiting_messages(db_url)
    assert messages == Counter({("retry", uid): 1 for uid in waiting}), (
        "one retry message per waiting user, nothing else"
    )
    before = status(dead)
    assert before["retry_queue_depth"] == before["retrying"] == len(waiting), before

    # A second retry message for a waiting user: counted once, emailed once.
    ((body,),) = query(db_url, "SELECT body FROM batchrun_queue WHERE dead = 0 ORDER BY id LIMIT 1")
    put_on_queue(db_url, str(body))

    drained = cli_json("retry", env=cli_env(db_url, smtp_server.url))
    emailed = smtp_server.sends_per_user(2025)
    assert set(emailed) == with_valid_address(db_url, first), "exactly the limit's users"
    assert set(emailed.values()) == {1}, "one email each"
    assert drained["processed"] == len(waiting), f"entities, not messages: {drained}"
    assert drained["succeeded"] == len(emailed) == len(smtp_server.messages), drained
    assert (drained["failed"], drained["remaining"]) == (0, 0), drained

    after = status(dead)
    assert (after["retry_queue_depth"], after["retrying"], after["dead_letter_depth"]) == (0, 0, 0)
    assert after["emails_sent"] == len(emailed), after
    assert after["pending"] == len(selected) - LIMIT, "the rest of the month is untouched"
    assert set(ledger(db_url)) == first
    assert {s for s, _ in ledger(db_url).values()} <= {int(State.SUCCEEDED), int(State.SKIPPED)}
    assert card_counts(db_url, 2025) == dict.fromkeys(with_valid_address(db_url, first), 1)


def test_a_limited_continuation_stopped_by_a_dead_mailer_takes_one_share(
    db_url: str, smtp_server: SmtpTestServer, dead_mail: str
) -> None:
    migrate_and_seed(db_url, 1000, seed=48)
    selected = month_users(db_url)
    share = set(selected[:30])
    body = QueueMessage("continuation", "birthday", MONTH, after_id=0, limit=30).to_json()
    put_on_queue(db_url, body)
    cli_json("retry", env=cli_env(db_url, dead_mail), code=3)
    waiting = in_state(db_url, State.RETRYING)
    assert waiting | in_state(db_url, State.SKIPPED) == set(ledger(db_url)) == share
    assert waiting_messages(db_url) == Counter({("retry", uid): 1 for uid in waiting}), (
        "the share waits as retry messages; the continuation is done with"
    )
    time.sleep(1.2)  # past the lease: a continuation kept for later would be back by now
    drained = cli_json("retry", env=cli_env(db_url, smtp_server.url))
    assert drained["remaining"] == 0, drained
    assert set(smtp_server.sends_per_user(2025)) == with_valid_address(db_url, share)
    assert set(ledger(db_url)) == share, "nobody beyond the continuation's limit"


def test_max_receives_one_dead_letters_each_user_once(db_url: str, dead_mail: str) -> None:
    migrate_and_seed(db_url, 600, seed=42)
    dead = cli_env(db_url, dead_mail, BATCHRUN_MAX_RECEIVES="1")
    run = ("birthday", "--month", MONTH, "--limit", "5")
    for _ in (1, 2):
        cli_json(*run, env=dead, code=3)
    waiting = in_state(db_url, State.RETRYING)
    assert len(waiting) == 5
    drained = cli_json("retry", env=dead, code=3)
    assert (drained["processed"], drained["dead_lettered"], drained["remaining"]) == (5, 5, 0)
    after = status(dead)
    assert after["dead_letter_depth"] == after["failed_permanent"] == 5, after
    assert (after["retry_queue_depth"], after["retrying"]) == (0, 0), after
    assert in_state(db_url, State.FAILED) == waiting


def test_a_rerun_that_sends_leaves_retry_nothing_to_do(
    db_url: str, smtp_server: SmtpTestServer, dead_mail: str
) -> None:
    migrate_and_seed(db_url, 600, seed=43)
    run = ("birthday", "--month", MONTH, "--limit", "20")
    cli_json(*run, env=cli_env(db_url, dead_mail), code=3)
    waiting = in_state(db_url, State.RETRYING)
    assert waiting
    working = cli_env(db_url, smtp_server.url)
    rerun = cli_json(*run, env=working)
    assert rerun["emails_sent"] == len(smtp_server.messages) > 0, rerun
    drained = cli_json("retry", env=working)
    assert drained["processed"] == drained["succeeded"] == 0, f"no work, nothing counted: {drained}"
    assert drained["remaining"] == 0, drained
    assert set(smtp_server.sends_per_user(2025).values()) == {1}, "no second email"
    # Between the rerun and this drain the stale messages still counted in the queue's
    # depth (the rerun cannot delete them); the drain deletes them without work.
    assert depths(db_url) == (0, 0)
    assert in_state(db_url, State.RETRYING) == set()


# -- 5: a worker outlives a mail outage ----------------------------------------------------


def test_worker_keeps_running_through_a_mail_outage_and_sends_after_it(
    mysql_url: str, smtp_server: SmtpTestServer
) -> None:
    db_url = mysql_url  # the outage is the mail server's: one database is enough
    migrate_and_seed(db_url, 600, seed=44)
    smtp_server.set_policy(lambda _rcpt, _n: UNAVAILABLE)  # 421 to every transaction
    # Attempts in the outage count: enough receives that none is dead-lettered meanwhile.
    env = cli_env(db_url, smtp_server.url, BATCHRUN_MAX_RECEIVES="50")
    cli_json("birthday", "--month", MONTH, "--limit", "10", env=env, code=3)
    waiting = in_state(db_url, State.RETRYING)
    want = with_valid_address(db_url, waiting)
    assert want
    refused_by_run = smtp_server.rejected

    worker = spawn("worker", "--prefetch", "10", "--json", env=env)
    try:
        assert wait_until(lambda: smtp_server.rejected > refused_by_run, timeout=20), (
            "the worker tried the mail server"
        )
        time.sleep(2)  # a few back-offs into the outage
        assert worker.poll() is None, "the worker exited in the outage"
        assert not smtp_server.messages
        smtp_server.set_policy(None)  # the mail server is back
        smtp_server.wait_for_messages(len(want), timeout=45)
        assert worker.poll() is None, "the worker keeps serving after the outage"
        worker.send_signal(signal.SIGTERM)
        out, err = finish(worker, timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, err
    assert json.loads(out)["remaining"] == 0, out
    assert smtp_server.sends_per_user(2025) == Counter(dict.fromkeys(want, 1))
    assert depths(db_url) == (0, 0)
    assert in_state(db_url, State.RETRYING) == set()


# -- 7: retry stopped by SIGINT --------------------------------------------------------------


def test_retry_stopped_by_sigint_exits_130_with_one_line(
    sqlite_url: str, smtp_server: SmtpTestServer, dead_mail: str
) -> None:
    db_url = sqlite_url  # the signal is the command's: one database is enough
    migrate_and_seed(db_url, 600, seed=45)
    dead = cli_env(db_url, dead_mail)
    cli_json("birthday", "--month", MONTH, "--limit", "30", env=dead, code=3)
    waiting = in_state(db_url, State.RETRYING)
    assert len(waiting) > 10
    smtp_server.set_latency(0.2)
    env = cli_env(
        db_url,
        smtp_server.url,
        # configured, so the one warning a run without it logs is not the line looked for
        BATCHRUN_UNSUBSCRIBE_URL="https://example.com/unsubscribe",
        BATCHRUN_UNSUBSCRIBE_SECRET="s3cret-for-the-test-only",
    )
    drain = spawn("retry", "--rate", "2", "--concurrency", "2", "--json", env=env)
    try:
        assert wait_until(lambda: len(smtp_server.messages) >= 1, timeout=20)
        drain.send_signal(signal.SIGINT)
        out, err = finish(drain, timeout=40)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == 130, f"exit {drain.returncode}: {err}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("stopped (received SIGINT)"), err
    summary = json.loads(out)
    assert summary["remaining"] > 0, summary
    # Nothing lost: every user is emailed or still waits with its one message.
    sent = set(smtp_server.sends_per_user(2025))
    still = in_state(db_url, State.RETRYING)
    assert depths(db_url) == (len(still), 0) and len(still) == summary["remaining"], summary
    assert sent | still >= with_valid_address(db_url, waiting)


# -- 8: a dry run and status leave a rollback-journal SQLite file as it was ---------------


def test_dry_run_and_status_leave_a_delete_mode_sqlite_file_unchanged(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = cli_env(sqlite_url, f"file://{tmp_path / 'outbox'}")
    migrate = run_cli("db", "migrate", env=env)
    assert migrate.returncode == 0, migrate.stderr
    migrate_and_seed(sqlite_url, 600, seed=46)
    cli_json("birthday", "--month", MONTH, "--limit", "10", env=env)  # the ledger has rows
    path = Path(sqlite_path(sqlite_url))
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    finally:
        conn.close()
    files = sorted(p.name for p in path.parent.iterdir())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    dry = cli_json("birthday", "--month", MONTH, "--dry-run", env=env)
    assert dry["dry_run"] is True and dry["eligible"] > 0, dry
    assert status(env)["emails_sent"] == 10

    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, "the file was written"
    assert sorted(p.name for p in path.parent.iterdir()) == files, "no -wal, -shm or journal"
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        conn.close()


# -- Jobs you define: submitted tasks, and a job from a file ----------------------------------


def test_two_tasks_for_one_user_consumed_at_once_have_one_effect(
    db_url: str, smtp_server: SmtpTestServer
) -> None:
    migrate_and_seed(db_url, 600, seed=47)
    uid = min(with_valid_address(db_url, set(month_users(db_url))))
    env = cli_env(db_url, smtp_server.url)
    submits = [
        spawn("submit", "birthday", "--period", MONTH, "--id", str(uid), env=env) for _ in (1, 2)
    ]
    for process in submits:
        _, err = finish(process)
        assert process.returncode == 0, err
    assert waiting_messages(db_url) == Counter({("task", uid): 2})

    smtp_server.set_latency(1.0)  # the first execution is still sending when both consume
    workers = [spawn("worker", "--idle-exit", "2", "--json", env=env) for _ in (1, 2)]
    results = [finish(w) for w in workers]
    for worker, (_, err) in zip(workers, results, strict=True):
        assert worker.returncode == 0, err
    summaries = [json.loads(out) for out, _ in results]
    assert sum(s["processed"] for s in summaries) == 1, f"one entity counted: {summaries}"
    assert sum(s["succeeded"] for s in summaries) == 1, summaries
    assert smtp_server.transactions == 1, "one execution: the second never reached the server"
    assert smtp_server.sends_per_user(2025) == Counter({uid: 1})
    assert card_counts(db_url, 2025) == {uid: 1}
    assert ledger(db_url) == {uid: (int(State.SUCCEEDED), 1)}
    assert depths(db_url) == (0, 0)


GREETINGS = '''\
"""A job of a team's own, on its own table, outside batchrun's package."""

import batchrun


class Greetings(batchrun.Job):
    name = "greet"
    period = "day"
    description = "Greet active users on their birthday"
    requires = {"users": ("id", "email", "full_name", "birthday", "active")}

    async def page(self, ctx, after, limit):
        return await ctx.db.fetch(
            "SELECT id, email, full_name FROM users WHERE active = 1 "
            "AND SUBSTR(birthday, 6, 5) = :day AND id > :after ORDER BY id LIMIT :limit",
            day=ctx.period.start.strftime("%m-%d"),
            after=after,
            limit=limit,
        )

    async def process(self, ctx, row):
        await ctx.send_email(
            to=row["email"],
            to_name=row["full_name"],
            subject="Happy birthday",
            text=f"Happy birthday, {row['full_name']}!",
        )
'''
USERS = [  # id, email, full_name, birthday, active
    (1, "ada@example.com", "Ada Lovelace", "1990-06-01", 1),
    (2, "bob@example.com", "Bob Marley", "1985-06-01", 1),
    (3, "cy@example.com", "Cy Twombly", "1990-06-01", 0),  # inactive
    (4, "dee@example.com", "Dee Dee", "1990-06-02", 1),  # another day
    (5, "eve@example.com", "Eve Arden", "2000-06-01", 1),
    (6, "fay@example.com", "Fay Wray", "1970-01-06", 1),  # the day and month swapped
]
GREETED = {"ada@example.com", "bob@example.com", "eve@example.com"}


def create_users_table(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            conn.execute(
                "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT, full_name TEXT, "
                "birthday TEXT, active INTEGER NOT NULL)"
            )
            conn.executemany("INSERT INTO users VALUES (?, ?, ?, ?, ?)", USERS)
            conn.commit()
        finally:
            conn.close()
        return
    query(
        db_url,
        "CREATE TABLE users (id BIGINT PRIMARY KEY, email VARCHAR(255), "
        "full_name VARCHAR(255), birthday DATE, active TINYINT NOT NULL)",
    )
    for row in USERS:
        query(db_url, "INSERT INTO users VALUES (%s, %s, %s, %s, %s)", *row)


def test_a_job_defined_in_a_file_runs_end_to_end(
    sqlite_url: str, smtp_server: SmtpTestServer, tmp_path: Path
) -> None:
    db_url = sqlite_url
    job_file = tmp_path / "team_jobs" / "greetings.py"
    job_file.parent.mkdir()
    job_file.write_text(GREETINGS, encoding="utf-8")
    create_users_table(db_url)
    env = cli_env(db_url, smtp_server.url, BATCHRUN_JOBS=str(job_file))
    day = ("--period", "2025-06-01")

    migrate = run_cli("db", "migrate", env=env)
    assert migrate.returncode == 0, migrate.stderr
    (listed,) = [j for j in cli_json("jobs", env=env) if j["name"] == "greet"]
    assert listed == {
        "name": "greet",
        "kind": "period",
        "period": "day",
        "once_per": "day",
        "description": "Greet active users on their birthday",
        "source": str(job_file.resolve()),
    }

    first = cli_json("run", "greet", *day, env=env)
    assert (first["eligible"], first["succeeded"], first["emails_sent"]) == (3, 3, 3), first
    recipients = Counter(r for m in smtp_server.messages for r in m.recipients)
    assert recipients == Counter(dict.fromkeys(GREETED, 1))

    again = cli_json("run", "greet", *day, env=env)
    assert (again["eligible"], again["emails_sent"]) == (0, 0), again
    assert len(smtp_server.messages) == 3, "a rerun sends nothing"

    counts = status(env, "greet", *day)
    assert counts["job"] == "greet" and counts["period"] == "2025-06-01", counts
    assert (counts["succeeded"], counts["skipped"], counts["retrying"]) == (3, 0, 0), counts
    assert (counts["failed_permanent"], counts["retry_queue_depth"]) == (0, 0), counts

    rows_before = ledger(db_url, "greet")
    shown = run_cli("preview", "greet", *day, "--id", "1", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "To: Ada Lovelace <ada@example.com>" in shown.stdout, shown.stdout
    assert "Subject: Happy birthday" in shown.stdout
    assert "Happy birthday, Ada Lovelace!" in shown.stdout
    assert len(smtp_server.messages) == 3, "a preview sends nothing"
    assert ledger(db_url, "greet") == rows_before, "a preview writes nothing"

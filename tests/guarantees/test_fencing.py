"""Fencing: a run that loses its claims stops working on them.

A run whose claims expire while it cannot renew them (its heartbeat waiting on a row lock
another session holds, or the whole process paused) must not go on sending to users a
second run took over meanwhile, and `retry` renews its claims as a run does. Each scenario
here disturbs one run, "the victim", in one of those ways, scaled down (a 3 s lease,
``--rate`` to make runs last), with real ``python -m batchrun``
processes, MariaDB (and SQLite), and the aiosmtpd server of ``smtp_server.py``:

- row-lock: another session holds ``SELECT ... FOR UPDATE`` on a ledger row of A's, so
  A's heartbeat cannot renew; B starts once A's lease has expired (and, "outlasting", the
  lock outlasts B's own claim's lock wait too);
- sigstop: A paused for three leases while B runs, then resumed (SQLite and MariaDB);
- retry-race: ``retry --rate 1`` holds its claims longer than a lease while a ``birthday``
  runs; retry-paused: the same ``retry`` paused for three leases.

Whatever the disturbance, in the end:

- every run exits 0 (or 3, and then a ``batchrun retry`` drains what it queued), and
  every eligible user has one card and at least one email;
- duplicates are at most the victim's ``--concurrency``: only what it had in flight when
  its lease ran out (invariant 3's window, the same as a crash's);
- a victim that lost claims says so: ``lost_claims`` in its JSON summary, and one line on
  stderr with that number.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.birthday import card_counts, eligible_ids
from support.cli import run_cli
from support.db import mysql_connect, pg_connect, query
from support.smtp_server import SmtpTestServer

from batchrun.mail.base import valid_address

LEASE_S = 3.0
MONTH = "2025-06"
YEAR = 2025
TEMPORARY = "451 4.3.0 Try again later"


# -- the harness ---------------------------------------------------------------------------


@dataclass
class Ended:
    """One batchrun process, finished."""

    name: str
    returncode: int
    summary: dict[str, Any]
    stderr: str
    started_s: float  # since the race began
    duration_s: float


@dataclass
class Race:
    """batchrun processes against one database and one SMTP server, and what they did."""

    db_url: str
    smtp: SmtpTestServer
    tmp_path: Path
    env: dict[str, str]
    t0: float = field(default_factory=time.monotonic)
    running: dict[str, tuple[subprocess.Popen[str], float, Path, Path]] = field(
        default_factory=dict
    )
    ended: dict[str, Ended] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)  # a scenario's own measurements

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.env, timeout=timeout)

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        """Start ``python -m batchrun ARGS --json``; its output goes to files (no pipe to
        fill while a test sleeps)."""
        out, err = self.tmp_path / f"{name}.out", self.tmp_path / f"{name}.err"
        full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "batchrun", *args, "--json"],
                env=full | self.env,
                cwd=ROOT,
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        self.running[name] = (proc, self.elapsed(), out, err)
        return proc

    def end_all(self, timeout: float = 60) -> list[Ended]:
        """Wait for every process started, noting when each exits."""
        deadline = time.monotonic() + timeout
        while self.running:
            for name, (proc, started, out, err) in list(self.running.items()):
                if proc.poll() is None:
                    continue
                del self.running[name]
                stdout, stderr = out.read_text(), err.read_text()
                assert stdout.strip(), f"{name}: no JSON summary (exit {proc.returncode}): {stderr}"
                self.ended[name] = Ended(
                    name,
                    proc.returncode,
                    json.loads(stdout),
                    stderr,
                    started,
                    self.elapsed() - started,
                )
            if time.monotonic() > deadline:
                late = {name: self.stderr_of(name)[-1000:] for name in self.running}
                pytest.fail(f"still running after {timeout} s: {late}")
            time.sleep(0.02)
        return sorted(self.ended.values(), key=lambda e: e.started_s)

    def stderr_of(self, name: str) -> str:
        """What a running process has written to stderr so far."""
        return self.running[name][3].read_text()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def stop_all(self) -> None:
        """Teardown: no process of a failed test outlives it (a stopped one is resumed)."""
        for proc, *_ in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
        self.running.clear()

    def held(self) -> list[tuple[int, str]]:
        """(entity id, owner) of every claim held now."""
        rows = query(
            self.db_url,
            "SELECT entity_id, owner FROM batchrun_ledger WHERE job = 'birthday' "
            "AND once_key = %s AND owner IS NOT NULL AND state IN (0, 3) ORDER BY entity_id",
            str(YEAR),
        )
        return [(int(uid), str(owner)) for uid, owner in rows]


def wait_until(done: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll ``done`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = done()
        if got:
            return got
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def birthday(concurrency: int, rate: float) -> tuple[str, ...]:
    return ("birthday", "--month", MONTH, "--concurrency", str(concurrency), "--rate", str(rate))


# -- the scenarios -------------------------------------------------------------------------
# Each starts its runs, disturbs the victim, and returns once every run has been started;
# the test then waits for them all and checks the outcome.

VICTIM_CONCURRENCY = 5
RATE = 8.0  # about 90 eligible users: some 11 s of sending for one run alone


def row_lock(race: Race, *, outlast_b: bool = False) -> None:
    """A blocked heartbeat: another session holds ``SELECT ... FOR UPDATE`` on the ledger
    row of A's last claimed user; A's heartbeat (one range UPDATE) waits on that lock and
    fails (the lock wait is bounded), A's lease expires, B starts and takes the users over.

    The lock goes after four leases, while B's claim waits on it; or, ``outlast_b``, only
    once B's claim has given up on it (B must go on, and claim those users later).
    """
    race.start("A", *birthday(VICTIM_CONCURRENCY, RATE))
    race.smtp.wait_for_messages(5, timeout=20)  # A is sending
    last = max(uid for uid, _ in wait_until(race.held, timeout=10, what="A's claims"))
    lock = RowLock(race.db_url)
    try:
        lock.hold(
            "SELECT * FROM batchrun_ledger WHERE job = 'birthday' AND once_key = %s "
            "AND entity_id = %s FOR UPDATE",
            (str(YEAR), last),
        )
        locked_at = time.monotonic()
        before = len(race.smtp.messages)
        time.sleep(LEASE_S + 2)  # past A's lease: its heartbeat has not got through
        race.notes["sent_by_A_while_locked"] = len(race.smtp.messages) - before
        race.start("B", *birthday(VICTIM_CONCURRENCY, RATE))
        if outlast_b:
            wait_until(
                lambda: "could not claim" in race.stderr_of("B"),
                timeout=30,
                what="B's claim to give up on the locked row",
            )
        else:
            time.sleep(max(0.0, locked_at + 4 * LEASE_S - time.monotonic()))
            # Released only while B's take-over waits on this very lock: A's heartbeat
            # (which also retries its lock waits) could otherwise be the waiter that gets
            # the row first, and A would keep its claims (the outlasting variant's case).
            wait_until(
                lambda: lock.blocks(TAKE_OVER),
                timeout=30,
                what="B's take-over to wait on the locked row",
            )
        race.notes["lock_held_s"] = round(time.monotonic() - locked_at, 1)
    finally:
        lock.release()


# The statement of a take-over of expired claims (claim_expired in batchrun's ledger.sql);
# a heartbeat sets lease_until alone.
TAKE_OVER = "SET owner = "


class RowLock:
    """Another session's open transaction holding a row lock (MySQL or PostgreSQL)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.pg = pg_connect(db_url) if db_url.startswith("postgres") else None
        self.my = None if self.pg is not None else mysql_connect(db_url)
        self.session = self._session_id()

    def _session_id(self) -> int:
        if self.pg is not None:
            return int(self.pg.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert self.my is not None
        with self.my.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID()")
            return int(cur.fetchone()[0])

    def blocks(self, statement: str) -> bool:
        """Whether a statement containing ``statement`` waits on this session's locks now
        (seen from another connection)."""
        if self.pg is not None:
            sql = (
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s "
                "AND %s = ANY(pg_blocking_pids(pid))"
            )
        else:
            sql = (
                "SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS w "
                "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
                "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
                "WHERE r.trx_query LIKE %s AND b.trx_mysql_thread_id = %s"
            )
        ((count,),) = query(self.db_url, sql, f"%{statement}%", self.session)
        return int(count) > 0

    def hold(self, sql: str, args: tuple[Any, ...]) -> None:
        if self.pg is not None:
            self.pg.execute("BEGIN")
            self.pg.execute(sql, args)
            return
        assert self.my is not None
        self.my.begin()
        with self.my.cursor() as cur:
            cur.execute(sql, args)

    def release(self) -> None:
        if self.pg is not None:
            self.pg.execute("ROLLBACK")
            self.pg.close()
        elif self.my is not None:
            self.my.rollback()
            self.my.close()


def sigstop(race: Race) -> None:
    """The everyday form: A paused (SIGSTOP) for three leases while B runs, then resumed."""
    victim = race.start("A", *birthday(VICTIM_CONCURRENCY, RATE))
    race.smtp.wait_for_messages(10, timeout=20)
    victim.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        race.notes["sent_before_stop"] = len(race.smtp.messages)
        race.start("B", *birthday(VICTIM_CONCURRENCY, RATE))
        time.sleep(3 * LEASE_S)
    finally:
        victim.send_signal(signal.SIGCONT)
    race.notes["stopped_s"] = round(time.monotonic() - stopped_at, 1)


def queue_everyone(race: Race) -> None:
    """A first run whose every send fails temporarily: the month waits in the retry queue."""
    race.smtp.set_policy(lambda _rcpt, _n: TEMPORARY)
    first = race.cli("birthday", "--month", MONTH, "--json")
    assert first.returncode == 3, first.stderr
    queued = json.loads(first.stdout)["queued_for_retry"]
    assert queued > 20, first.stdout
    race.smtp.reset()  # the server recovers; the failed attempts were never accepted
    race.notes["queued"] = queued


def start_retry(race: Race) -> subprocess.Popen[str]:
    """``retry --rate 1``: ten entities claimed at once, worked for about ten seconds."""
    proc = race.start(
        "retry", "retry", "--rate", "1", "--max", "10", "--concurrency", str(VICTIM_CONCURRENCY)
    )
    race.notes["retry_claimed"] = len(wait_until(race.held, timeout=20, what="retry's claims"))
    return proc


def retry_race(race: Race) -> None:
    """A slow retry: ``retry --rate 1`` holds its claims for longer than a lease
    while a ``birthday`` started meanwhile looks for unfinished users."""
    queue_everyone(race)
    start_retry(race)
    time.sleep(LEASE_S + 1)  # without a heartbeat, the retry's claims would have expired
    race.notes["held_by_retry_when_B_started"] = len(race.held())
    assert race.notes["held_by_retry_when_B_started"] > 0, "the retry ended before B started"
    race.start("B", *birthday(20, 50.0))


def retry_paused(race: Race) -> None:
    """The consumer's fence: ``retry`` paused (SIGSTOP) for three leases while a
    ``birthday`` takes its claims over, then resumed."""
    queue_everyone(race)
    victim = start_retry(race)
    race.smtp.wait_for_messages(2, timeout=10)
    victim.send_signal(signal.SIGSTOP)
    try:
        race.start("B", *birthday(20, 50.0))
        time.sleep(3 * LEASE_S)
    finally:
        victim.send_signal(signal.SIGCONT)


@dataclass(frozen=True)
class Scenario:
    backend: str  # the database fixture: "mysql", "postgres" or "sqlite"
    play: Callable[[Race], None]
    victim: str  # the run that cannot renew its claims (or, fixed, must not lose them)
    loses_claims: bool | None  # whether the victim must lose claims (None: it may)
    users: int = 1200
    latency_s: float = 0.0  # the SMTP server's per-message delay


SCENARIOS = {
    "row-lock-mysql": Scenario("mysql", row_lock, victim="A", loses_claims=True),
    "row-lock-outlasting-mysql": Scenario(
        "mysql",
        functools.partial(row_lock, outlast_b=True),
        victim="A",
        loses_claims=None,  # after the lock: A's heartbeat or B's claim, whichever goes first
        users=600,
    ),
    "row-lock-postgresql": Scenario("postgres", row_lock, victim="A", loses_claims=True),
    "sigstop-sqlite": Scenario("sqlite", sigstop, victim="A", loses_claims=True, latency_s=0.2),
    "sigstop-mysql": Scenario("mysql", sigstop, victim="A", loses_claims=True, latency_s=0.2),
    "retry-race-mysql": Scenario("mysql", retry_race, victim="retry", loses_claims=False),
    "retry-paused-mysql": Scenario("mysql", retry_paused, victim="retry", loses_claims=True),
}


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_run_that_loses_its_claims_stops_working_on_them(
    name: str,
    request: pytest.FixtureRequest,
    smtp_server: SmtpTestServer,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    scenario = SCENARIOS[name]
    db_url = str(request.getfixturevalue(f"{scenario.backend}_url"))
    race = Race(
        db_url,
        smtp_server,
        tmp_path,
        {
            "BATCHRUN_DB": db_url,
            "BATCHRUN_MAIL": smtp_server.url,
            "BATCHRUN_FROM": "birthday@example.com",
            "BATCHRUN_LEASE_S": str(LEASE_S),
            "BATCHRUN_RETRY_BASE_S": "0",
            "COLUMNS": "400",  # rich wraps log lines at the terminal width; keep one per line
            "PYTHONPATH": str(ROOT),  # this checkout's batchrun, whatever the venv installed
        },
    )
    assert race.cli("db", "migrate").returncode == 0
    seeded = race.cli("db", "seed", "--users", str(scenario.users), "--seed", "41")
    assert seeded.returncode == 0, seeded.stderr
    emails = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = 6"))
    want = {uid for uid in eligible_ids(db_url, 6) if valid_address(emails[uid])}
    smtp_server.set_latency(scenario.latency_s)
    race.t0 = time.monotonic()

    try:
        scenario.play(race)
        runs = race.end_all()
    finally:
        race.stop_all()
    smtp_server.set_latency(0)
    for run in runs:
        assert "Traceback" not in run.stderr, f"{run.name}: {run.stderr}"
        assert run.returncode in (0, 3), f"{run.name} exit {run.returncode}: {run.stderr}"

    drained = None
    if any(run.returncode == 3 for run in runs):
        drained = race.cli("retry", "--json")  # what a run queued for retry
        assert drained.returncode == 0, drained.stderr

    per_user = smtp_server.sends_per_user(YEAR)
    duplicates = sum(n - 1 for n in per_user.values())
    victim = race.ended[scenario.victim]
    lost = int(victim.summary.get("lost_claims", 0))
    measured = {
        "want": len(want),
        "emails": sum(per_user.values()),
        "duplicates": duplicates,
        "lost_claims": lost,
        "retry_needed": drained is not None,
        **{f"{r.name}_s": f"{r.started_s:.1f}+{r.duration_s:.1f}" for r in runs},
        **{f"{r.name}_exit": r.returncode for r in runs},
        **race.notes,
    }
    for key, value in measured.items():
        record_property(key, value)
    print(f"\n{name}: {measured}")
    for run in runs:
        print(f"  {run.name}: {run.summary}")
        print("".join(f"    {line.rstrip()}\n" for line in run.stderr.splitlines()), end="")

    assert set(per_user) == want, (
        f"every eligible user emailed, nobody else: missing {sorted(want - set(per_user))[:10]}, "
        f"extra {sorted(set(per_user) - want)[:10]}"
    )
    assert card_counts(db_url, YEAR) == dict.fromkeys(want, 1), "one card each"
    assert duplicates <= VICTIM_CONCURRENCY, (
        f"{duplicates} duplicates: more than the victim had in flight ({VICTIM_CONCURRENCY})"
    )
    other = race.ended["B"]
    assert other.summary["lost_claims"] == 0, other.summary
    if scenario.victim == "A":
        # A claimed the whole month with its first page (page size 500, some 94 users), so
        # every user B claimed it took over from A: lost_claims counts each of them once.
        assert lost == other.summary["eligible"], (victim.summary, other.summary)
    else:
        assert lost <= race.notes["retry_claimed"], (victim.summary, race.notes)
    said = [line for line in victim.stderr.splitlines() if "claims were taken over" in line]
    if scenario.loses_claims or (scenario.loses_claims is None and lost):
        assert lost > 0, f"the victim lost claims and must count them: {victim.summary}"
        assert len(said) == 1 and f"{lost} claims were taken over" in said[0], victim.stderr
    else:
        assert lost == 0 and not said, f"the heartbeat kept the claims: {victim.stderr}"
        assert duplicates == 0, "no claim was lost, so no user was worked twice"

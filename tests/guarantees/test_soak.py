"""The long fault-injection variants: ``make soak``, never ``make test`` nor CI.

Skipped unless ``BATCHRUN_SOAK=1``. Sizes from the environment:

- ``BATCHRUN_SOAK_ITERATIONS`` (100): crash-anywhere iterations per database, each with one
  to three SIGKILLs at random moments, 1% temporary failures, then a rerun and a retry drain.
- ``BATCHRUN_SOAK_USERS`` (1,000,000): users for the load run on MariaDB, all born in the
  month (multi-row INSERTs, 0.1% invalid addresses), against an SMTP sink in its own
  process that fails 1% of recipients with a 4xx: a million emails, about ten minutes here.
  ``BATCHRUN_SOAK_ALL_IN_MONTH=0`` seeds them with ``batchrun db seed`` instead (a twelfth
  born in the month, some inactive, without or with an invalid address).
- ``BATCHRUN_SOAK_LEASE_S`` (3) and ``BATCHRUN_SOAK_HEARTBEAT_FAIL`` (0.3): the lease and
  the share of heartbeats that fail at random in the crash-anywhere variant with a failing
  heartbeat (the fault hook is ``tests/support/soak_hooks/sitecustomize.py``, put on the CLI
  subprocesses' ``PYTHONPATH`` only: batchrun itself has no hook).
- ``BATCHRUN_TEST_SEED``: replays another seed.

Each test prints its figures (run ``pytest -s``, as ``make soak`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import pytest
from support import SUPPORT
from support.db import mysql_connect

SOAK = os.environ.get("BATCHRUN_SOAK") == "1"
pytestmark = pytest.mark.skipif(not SOAK, reason="long variants: BATCHRUN_SOAK=1 (make soak)")

ITERATIONS = int(os.environ.get("BATCHRUN_SOAK_ITERATIONS", "100"))
USERS = int(os.environ.get("BATCHRUN_SOAK_USERS", "1000000"))
ALL_IN_MONTH = os.environ.get("BATCHRUN_SOAK_ALL_IN_MONTH", "1") == "1"
SEED = int(os.environ.get("BATCHRUN_TEST_SEED", "20250607"))
FAIL_RATE = 0.01
LOAD_CONCURRENCY = 100
LEASE_S = os.environ.get("BATCHRUN_SOAK_LEASE_S", "3")
HEARTBEAT_FAIL = float(os.environ.get("BATCHRUN_SOAK_HEARTBEAT_FAIL", "0.3"))
HOOKS = SUPPORT / "soak_hooks"
# The sink runs this file as a script: tests/ on its path for the support package.
TESTS_PATH = [str(SUPPORT.parent), *filter(None, [os.environ.get("PYTHONPATH")])]


# -- the SMTP sink (its own process: `python tests/guarantees/test_soak.py --sink`) -------

_MESSAGE_ID = re.compile(rb"(?im)^Message-ID:[ \t]*<([^>]*)>")


class _Sink:
    """What the sink saw: accepted Message-IDs with their counts, and the refusals."""

    def __init__(self, fail_rate: float, seed: int) -> None:
        self.fail_rate = fail_rate
        self.rng = random.Random(seed)
        self.counts: Counter[bytes] = Counter()
        self.messages = 0
        self.rejected = 0
        self.connections = 0

    def stats(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "distinct": len(self.counts),
            "rejected": self.rejected,
            "connections": self.connections,
            "cpu_s": round(time.process_time(), 1),
        }


class _Session(asyncio.Protocol):
    """A minimal SMTP server session: EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.buffer = b""
        self.in_data = False
        self.recipients = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sink.connections += 1
        transport.write(b"220 sink ESMTP\r\n")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None:
            if self.in_data:
                end = self.buffer.find(b"\r\n.\r\n")
                if end < 0:
                    return
                content, self.buffer = self.buffer[:end], self.buffer[end + 5 :]
                self.in_data = False
                self._accept(content)
                continue
            eol = self.buffer.find(b"\r\n")
            if eol < 0:
                return
            line, self.buffer = self.buffer[:eol], self.buffer[eol + 2 :]
            self._command(line)

    def _command(self, line: bytes) -> None:
        assert self.transport is not None
        verb = line[:4].upper()
        if verb == b"EHLO":
            self.transport.write(b"250-sink\r\n250-8BITMIME\r\n250 SIZE 33554432\r\n")
        elif verb in (b"HELO", b"NOOP"):
            self.transport.write(b"250 OK\r\n")
        elif verb == b"MAIL":
            self.recipients = 0
            self.transport.write(b"250 OK\r\n")
        elif verb == b"RCPT":
            if self.sink.rng.random() < self.sink.fail_rate:
                self.sink.rejected += 1
                self.transport.write(b"451 4.3.0 Try again later\r\n")
            else:
                self.recipients += 1
                self.transport.write(b"250 OK\r\n")
        elif verb == b"DATA":
            if not self.recipients:
                self.transport.write(b"503 5.5.1 No valid recipients\r\n")
            else:
                self.in_data = True
                self.transport.write(b"354 End data with <CR><LF>.<CR><LF>\r\n")
        elif verb == b"RSET":
            self.recipients = 0
            self.transport.write(b"250 OK\r\n")
        elif verb == b"QUIT":
            self.transport.write(b"221 Bye\r\n")
            self.transport.close()
        else:
            self.transport.write(b"500 5.5.2 Unknown command\r\n")

    def _accept(self, content: bytes) -> None:
        assert self.transport is not None
        head = content.split(b"\r\n\r\n", 1)[0]
        found = _MESSAGE_ID.search(head)
        self.sink.counts[found[1] if found else b"?"] += 1
        self.sink.messages += 1
        self.recipients = 0
        self.transport.write(b"250 OK accepted\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def _serve(fail_rate: float, seed: int) -> None:
    sink = _Sink(fail_rate, seed)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Session(sink), "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port}), flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        command, _, argument = line.partition(" ")
        if command == "dump":
            Path(argument).write_text(json.dumps({k.decode(): v for k, v in sink.counts.items()}))
        print(json.dumps(sink.stats()), flush=True)
    server.close()


class SmtpSink:
    """Start and talk to the sink process (stdin commands, one JSON line back each)."""

    def __init__(self, fail_rate: float, seed: int) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--sink",
                "--fail-rate",
                str(fail_rate),
                "--seed",
                str(seed),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(TESTS_PATH)},
        )
        self.port = int(json.loads(self._out.readline())["port"])

    @property
    def _out(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._out.readline())
        return answer

    def counts(self, path: Path) -> dict[str, int]:
        self.ask(f"dump {path}")
        counts: dict[str, int] = json.loads(path.read_text())
        return counts

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)
        self._out.close()


# -- crash anywhere, longer ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_soak_crash_anywhere_with_temporary_failures(db_url: str, smtp_server: Any) -> None:
    from support.crash import crash_anywhere

    report = crash_anywhere(
        db_url,
        smtp_server,
        seed=SEED,
        iterations=ITERATIONS,
        users=6000,
        max_delay_s=2.5,
        kills_per_iteration=(1, 3),
        fail_rate=FAIL_RATE,
        first_year=2100,
    )
    print(f"\nSOAK crash anywhere ({db_url.split(':')[0]}): {json.dumps(asdict(report))}")
    assert report.iterations == ITERATIONS
    assert report.mid_month >= ITERATIONS // 4, asdict(report)


def _heartbeat_figures(log: Path) -> dict[str, Any]:
    """What the fault hook's log says: heartbeats, failures, processes, failure streaks.

    A streak is consecutive failures in one process; two or more at the lease's 1/3 cadence
    put its workers behind the fence (past ``lease - margin`` without a renewal).
    """
    outcomes: dict[str, list[str]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            pid, outcome = line.split()
            outcomes.setdefault(pid, []).append(outcome)
    streaks: Counter[int] = Counter()
    for seq in outcomes.values():
        run = 0
        for outcome in [*seq, "pass"]:
            if outcome == "fail":
                run += 1
            elif run:
                streaks[run] += 1
                run = 0
    calls = sum(len(seq) for seq in outcomes.values())
    failed = sum(seq.count("fail") for seq in outcomes.values())
    return {
        "heartbeats": calls,
        "heartbeats_failed": failed,
        "failed_share": round(failed / calls, 3) if calls else None,
        "processes_with_heartbeats": len(outcomes),
        "processes_with_a_failure": sum("fail" in seq for seq in outcomes.values()),
        "fail_streaks": dict(sorted(streaks.items())),
        "fenced_streaks": sum(n for k, n in streaks.items() if k >= 2),
    }


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_soak_crash_anywhere_with_a_failing_heartbeat(
    db_url: str, smtp_server: Any, tmp_path: Path
) -> None:
    """The crash-anywhere soak with a 3 s lease and 30% of heartbeats failing at random.

    A failed heartbeat leaves the claims unrenewed: past the lease (less its margin) the
    run's workers wait behind the fence until one succeeds, and the killed runs' claims
    expire for the rerun as before. Same invariants as the soak above (one card each,
    every eligible user emailed, duplicates at most kills x concurrency, nothing left
    claimed, the ledger consistent), and the injection must really have happened.
    """
    from support import ROOT
    from support.crash import CONCURRENCY, crash_anywhere

    log = tmp_path / "heartbeats.log"
    path = [str(HOOKS), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    extra_env = {
        "BATCHRUN_LEASE_S": LEASE_S,
        "BATCHRUN_SOAK_HEARTBEAT_FAIL": str(HEARTBEAT_FAIL),
        "BATCHRUN_SOAK_HEARTBEAT_SEED": str(SEED),
        "BATCHRUN_SOAK_HEARTBEAT_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(path),
    }
    report = crash_anywhere(
        db_url,
        smtp_server,
        seed=SEED,
        iterations=ITERATIONS,
        users=6000,
        max_delay_s=2.5,
        kills_per_iteration=(1, 3),
        fail_rate=FAIL_RATE,
        first_year=2100,
        # 50 ms per message (the other soak: 20 ms): a month takes a few seconds to send,
        # so runs live through several heartbeats and failure streaks reach the fence.
        latency_s=0.05,
        extra_env=extra_env,
    )
    figures = {
        "lease_s": float(LEASE_S),
        "heartbeat_fail": HEARTBEAT_FAIL,
        **asdict(report),
        # crash_anywhere asserts each iteration's duplicates <= its kills x concurrency
        "duplicate_bound_total": report.kills * CONCURRENCY,
        **_heartbeat_figures(log),
    }
    print(
        f"\nSOAK crash anywhere, failing heartbeat ({db_url.split(':')[0]}): {json.dumps(figures)}"
    )
    assert report.iterations == ITERATIONS
    assert report.mid_month >= ITERATIONS // 4, figures
    if HEARTBEAT_FAIL > 0:
        assert figures["heartbeats_failed"] > 0, f"the fault hook never fired: {figures}"


# -- load: a million users, 1% temporary failures ---------------------------------------------


def _seed_month(mysql_url: str, users: int, seed: int) -> None:
    """``users`` active users born in June with multi-row INSERTs; 0.1% invalid addresses."""
    rng = random.Random(seed)
    first = ["Ada", "Grace", "Alan", "Zoë", "José", "李", "Søren", "Margaret"]
    last = ["Lovelace", "Hopper", "Turing", "Müller", "O'Brien", "Nakamura"]
    conn = mysql_connect(mysql_url)
    try:
        with conn.cursor() as cur:
            batch: list[tuple[Any, ...]] = []
            for n in range(1, users + 1):
                bad = rng.random() < 0.001
                email = f"u{n}@" if bad else f"u{n}.{rng.randrange(10**6):06d}@example.com"
                born = f"{rng.randint(1950, 2006)}-06-{rng.randint(1, 30):02d}"
                batch.append((rng.choice(first), rng.choice(last), email, born, 10))
                if len(batch) == 5000 or n == users:
                    # pymysql sends one multi-row INSERT per executemany batch.
                    cur.executemany(
                        "INSERT INTO user (first_name, last_name, email, date_of_birth, status) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        batch,
                    )
                    batch = []
    finally:
        conn.close()


def _peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM), from /proc while it runs.

    Not ``ru_maxrss`` from ``wait4``: Linux carries the forked parent's high-water mark
    across ``exec`` into the child's, so it would report this test's own memory.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def _timed_cli(
    *args: str, env: dict[str, str], log: Path
) -> tuple[int, dict[str, Any], dict[str, float]]:
    """Run ``python -m batchrun ARGS --json``; return exit code, summary, wall s, peak RSS."""
    from support import ROOT

    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    started = time.monotonic()
    peak = 0.0
    with log.open("w") as err, (log.with_suffix(".json")).open("w+") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchrun", *args, "--json"],
            env=full,
            cwd=ROOT,
            stdout=out,
            stderr=err,
        )
        while process.poll() is None:
            peak = max(peak, _peak_rss_mb(process.pid) or 0.0)
            time.sleep(0.5)
        out.seek(0)
        text = out.read()
    wall = time.monotonic() - started
    summary: dict[str, Any] = json.loads(text) if text.strip() else {}
    return process.returncode, summary, {"wall_s": round(wall, 1), "peak_rss_mb": round(peak, 1)}


def _month_users(mysql_url: str) -> tuple[set[int], set[int]]:
    """(eligible, valid): users the June run takes on, and those with a valid address."""
    from batchrun.mail.base import valid_address

    conn = mysql_connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT id, email FROM user WHERE birth_month = 6 AND status = 10 "
                "AND email IS NOT NULL"
            )
            rows = cur.fetchall()
    finally:
        conn.close()
    return {int(r[0]) for r in rows}, {int(r[0]) for r in rows if valid_address(r[1])}


@pytest.mark.slow
@pytest.mark.timeout(3 * 3600)
def test_soak_a_million_users_with_one_percent_temporary_failures(
    mysql_url: str, tmp_path: Path
) -> None:
    from support.cli import run_cli

    sink = SmtpSink(FAIL_RATE, SEED)
    figures: dict[str, Any] = {
        "users": USERS,
        "all_in_month": ALL_IN_MONTH,
        "concurrency": LOAD_CONCURRENCY,
    }
    try:
        env = {
            "BATCHRUN_DB": mysql_url,
            "BATCHRUN_MAIL": f"{sink.url}?pool={LOAD_CONCURRENCY}",
            "BATCHRUN_FROM": "birthday@example.com",
            "BATCHRUN_RETRY_BASE_S": "0",
        }
        assert run_cli("db", "migrate", env=env).returncode == 0
        started = time.monotonic()
        if ALL_IN_MONTH:
            _seed_month(mysql_url, USERS, SEED)
        else:
            seeded = run_cli(
                "db", "seed", "--users", str(USERS), "--seed", str(SEED), env=env, timeout=600
            )
            assert seeded.returncode == 0, seeded.stderr
        figures["seed_s"] = round(time.monotonic() - started, 1)
        eligible, valid = _month_users(mysql_url)
        figures["eligible"], figures["valid"] = len(eligible), len(valid)

        code, run, timing = _timed_cli(
            "birthday", "--month", "2025-06", "--concurrency", str(LOAD_CONCURRENCY),
            env=env, log=tmp_path / "birthday.log",
        )  # fmt: skip
        assert code == 3, (tmp_path / "birthday.log").read_text()[-3000:]
        keys = ("eligible", "skipped", "cards_created", "emails_sent", "failed")
        keys += ("queued_for_retry", "duration_s")
        figures["birthday"] = {**timing, **{k: run[k] for k in keys}}
        figures["birthday"]["users_per_s"] = round(run["eligible"] / run["duration_s"])
        assert run["eligible"] == len(eligible)
        assert run["skipped"] == len(eligible - valid)
        assert run["cards_created"] == len(valid)
        assert run["failed"] == run["queued_for_retry"] == len(valid) - run["emails_sent"]
        assert 0.005 * len(valid) < run["failed"] < 0.02 * len(valid), "about 1% failed"

        code, drain, timing = _timed_cli(
            "retry", "--concurrency", str(LOAD_CONCURRENCY), "--max", str(10 * USERS),
            env=env, log=tmp_path / "retry.log",
        )  # fmt: skip
        # Exit 3 when some retries failed again, even if a later receive in the same drain
        # sent them: the state below is what counts.
        assert code in (0, 3), (tmp_path / "retry.log").read_text()[-3000:]
        figures["retry"] = {**timing, **drain}
        assert drain["remaining"] == 0 and drain["dead_lettered"] == 0, drain

        # The invariants over the whole month.
        conn = mysql_connect(mysql_url)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT idempotency_key, gift_code FROM gift_card "
                    "WHERE idempotency_key LIKE 'birthday:2025:%'"
                )
                cards = cur.fetchall()
                cur.execute(
                    "SELECT state, COUNT(*), SUM(owner IS NOT NULL) FROM batchrun_ledger "
                    "WHERE once_key = '2025' GROUP BY state"
                )
                states = {int(s): (int(n), int(held)) for s, n, held in cur.fetchall()}
                cur.execute("SELECT COUNT(*) FROM batchrun_queue")
                (queued,) = cur.fetchone() or (None,)
        finally:
            conn.close()
        carded = Counter(int(str(key).rsplit(":", 1)[1]) for key, _ in cards)
        assert carded == Counter(dict.fromkeys(valid, 1)), "one card per valid user"
        assert len({code for _, code in cards}) == len(cards), "unique gift codes"
        skipped = len(eligible - valid)
        assert states == {1: (len(valid), 0), **({2: (skipped, 0)} if skipped else {})}, states
        assert queued == 0, "the queue is empty, nothing dead-lettered"
        counts = sink.counts(tmp_path / "counts.json")
        figures["sink"] = sink.ask("stats")
        want = {f"birthday.2025.{uid}@example.com" for uid in valid}
        assert set(counts) == want, "every valid user emailed, nobody else"
        duplicates = sum(n - 1 for n in counts.values())
        assert duplicates == 0, f"{duplicates} duplicate emails without any crash"
        status = run_cli("status", "--month", "2025-06", "--json", env=env)
        figures["status"] = {k: v for k, v in json.loads(status.stdout).items() if k != "problems"}
        assert figures["status"]["pending"] == 0
        figures["total_s"] = round(time.monotonic() - started, 1)
        figures["test_max_rss_mb"] = round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
    finally:
        sink.close()
        print(f"\nSOAK load: {json.dumps(figures)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sink", action="store_true", required=True)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    asyncio.run(_serve(options.fail_rate, options.seed))

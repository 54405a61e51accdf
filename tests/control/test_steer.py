"""See and steer from the command line, across processes, on every database: the history
rows of every outcome, `runs`, `status` with no job, pause / resume and cancel."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.cli import run_cli
from support.db import query
from support.smtp_server import SmtpTestServer

from batchrun import aws_lambda

LEASE_S = 1.5  # heartbeats every 0.5 s: pause and cancel are seen within that


def _env(db_url: str, smtp_server: SmtpTestServer) -> dict[str, str]:
    return {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_LEASE_S": str(LEASE_S),
        "BATCHRUN_RETRY_BASE_S": "0",
        "BATCHRUN_MAIL_TIMEOUT_S": "5",
    }


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_leftover_processes() -> Iterator[None]:
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    process = subprocess.Popen(
        [sys.executable, "-m", "batchrun", *args],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(process)
    return process


def _month_run(env: dict[str, str], month: str) -> subprocess.Popen[str]:
    return _start(env, "birthday", "--month", month, "--concurrency", "2", "--json")


def _runs(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = run_cli("runs", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert isinstance(rows, list)
    return rows


def _eligible(db_url: str, month: int) -> int:
    rows = query(
        db_url,
        "SELECT COUNT(*) FROM user WHERE birth_month = %s AND status = 10 AND email IS NOT NULL",
        month,
    )
    return int(rows[0][0])


@pytest.fixture
def seeded(db_url: str, smtp_server: SmtpTestServer) -> dict[str, str]:
    env = _env(db_url, smtp_server)
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "1500", "--seed", "5", env=env).returncode == 0
    return env


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_history_rows_for_every_outcome(
    db_url: str, smtp_server: SmtpTestServer, seeded: dict[str, str], tmp_path: Path
) -> None:
    env = seeded
    ok = run_cli("birthday", "--month", "2025-01", "--json", env=env)
    assert ok.returncode == 0, ok.stderr

    smtp_server.set_policy(lambda _rcpt, _n: "451 4.3.0 try again later")
    retrying = run_cli("birthday", "--month", "2025-02", "--json", env=env)
    assert retrying.returncode == 3, retrying.stderr
    smtp_server.set_policy(None)

    # A broken setup (a mail server that is down instead hands the month on: exit 3).
    (tmp_path / "notadir").write_text("")
    outbox = f"file://{tmp_path / 'notadir'}"
    failed = run_cli("--mail", outbox, "birthday", "--month", "2025-03", "--json", env=env)
    assert failed.returncode == 1, failed.stderr

    smtp_server.set_latency(0.05)  # a run of some seconds: signals land mid-month
    before = len(smtp_server.messages)
    victim = _month_run(env, "2025-04")
    smtp_server.wait_for_messages(before + 3, timeout=30)
    victim.send_signal(signal.SIGINT)
    out, err = victim.communicate(timeout=30)
    assert victim.returncode == 130, err
    assert json.loads(out)["stopped"] == "received SIGINT"
    status = json.loads(run_cli("status", "--month", "2025-04", "--json", env=env).stdout)
    assert status["claimed"] == 0, "no live run holds them"
    assert status["claimed_by_stopped_run"] == json.loads(out)["left_pending"] > 0

    before = len(smtp_server.messages)
    cancelled = _month_run(env, "2025-05")
    smtp_server.wait_for_messages(before + 3, timeout=30)
    assert run_cli("cancel", "birthday", "--period", "2025-05", env=env).returncode == 0
    out, err = cancelled.communicate(timeout=LEASE_S * 4 + 10)  # a heartbeat, then the grace
    assert cancelled.returncode == 130, err
    summary = json.loads(out)
    assert summary["stopped"] == "cancelled"
    assert summary["left_pending"] > 0, "cancelled mid-month: the rest stays pending"
    # A cancel ends the runs going on, not later ones.
    smtp_server.set_latency(0)
    later = run_cli("birthday", "--month", "2025-05", "--json", env=env)
    assert later.returncode == 0, later.stderr
    assert json.loads(later.stdout)["stopped"] is None

    smtp_server.set_latency(0.05)
    before = len(smtp_server.messages)
    dead = _month_run(env, "2025-06")
    smtp_server.wait_for_messages(before + 3, timeout=30)
    dead.kill()  # SIGKILL: the row stays 'running' with its last heartbeat
    dead.communicate(timeout=10)
    smtp_server.set_latency(0)
    time.sleep(LEASE_S + 0.5)  # the lease passes

    rows = _runs(env, "birthday")
    by_month = {r["period"]: r for r in reversed(rows)}  # the newest of a month wins
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    outcomes = {month: (r["outcome"], r["exit_code"]) for month, r in by_month.items()}
    assert outcomes == {
        "2025-01": ("ok", 0),
        "2025-02": ("retrying", 3),
        "2025-03": ("failed", 1),
        "2025-04": ("stopped", 130),
        "2025-05": ("ok", 0),  # the later run; the cancelled one below it
        "2025-06": ("crashed", None),
    }
    may = [r for r in rows if r["period"] == "2025-05"]
    assert [r["outcome"] for r in may] == ["ok", "cancelled"]
    assert may[1]["counts"]["stopped"] == "cancelled"
    assert by_month["2025-03"]["error"], "the one error line"
    assert by_month["2025-06"]["ended_at"] is None
    assert by_month["2025-01"]["counts"]["emails_sent"] == _eligible_sent(ok.stdout)
    assert all(r["kind"] == "run" and r["pid"] > 0 and r["host"] for r in rows)
    assert _runs(env, "--limit", "2") == rows[:2]
    assert _runs(env, "birthday", "--since", "2000-01-01") == rows
    assert _runs(env, "--since", "7d") == rows

    overview = run_cli("status", "--json", env=env)
    assert overview.returncode == 0, overview.stderr
    job = json.loads(overview.stdout)["jobs"]["birthday"]
    assert job["last_run"]["period"] == "2025-06" and job["last_run"]["outcome"] == "crashed"
    assert job["running"] == []
    text = run_cli("status", env=env)
    assert text.returncode == 0 and "birthday" in text.stdout and "crashed" in text.stdout


@pytest.mark.timeout(300)
def test_a_cancel_stops_a_retry_drain_working_the_job(
    smtp_server: SmtpTestServer, seeded: dict[str, str]
) -> None:
    """A drain is a run going on: `cancel` counted it ("1 run going on"), yet it worked
    every message, exited 3 and was recorded `retrying` (each batch heard only of the
    cancels given after it began)."""
    env = seeded
    smtp_server.set_policy(lambda _rcpt, _n: "451 4.3.0 try again later")
    failed = run_cli("birthday", "--month", "2025-02", "--json", env=env)
    assert failed.returncode == 3, failed.stderr
    queued = json.loads(failed.stdout)["queued_for_retry"]
    assert queued > 20
    smtp_server.set_policy(None)

    before = len(smtp_server.messages)
    drain = _start(env, "retry", "--rate", "4", "--concurrency", "1", "--json")
    smtp_server.wait_for_messages(before + 3, timeout=30)
    cancel = run_cli("cancel", "birthday", env=env)
    assert "(1 run going on)" in cancel.stderr, cancel.stderr
    out, err = drain.communicate(timeout=LEASE_S * 4 + 30)
    assert drain.returncode == 130, err
    summary = json.loads(out)
    assert summary["stopped"] == "cancelled", summary
    assert 0 < summary["remaining"] < queued, summary
    assert "stopped (cancelled)" in err, err
    assert _runs(env, "--limit", "1")[0]["outcome"] == "cancelled"
    # Later drains are not affected: the next one works what is there (the messages the
    # cancelled one had received and not worked come back after their visibility).
    rest = run_cli("retry", "--json", env=env)
    assert rest.returncode == 0, rest.stderr
    assert json.loads(rest.stdout)["succeeded"] > 0, rest.stdout


def _eligible_sent(stdout: str) -> int:
    return int(json.loads(stdout)["emails_sent"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pause_then_resume_across_two_processes(
    db_url: str, smtp_server: SmtpTestServer, seeded: dict[str, str]
) -> None:
    env = seeded
    want = _eligible(db_url, 6)
    smtp_server.set_latency(0.05)
    run = _month_run(env, "2025-06")
    smtp_server.wait_for_messages(3, timeout=30)
    paused = run_cli("pause", "birthday", "--reason", "SES complaint rate", env=env)
    assert paused.returncode == 0, paused.stderr
    time.sleep(LEASE_S)  # the run's next heartbeat, and the entities in flight finish
    first = len(smtp_server.messages)
    time.sleep(LEASE_S * 2)  # several heartbeats, with claims kept alive meanwhile
    second = len(smtp_server.messages)
    assert first == second, "no email goes out while the job is paused"
    assert first < want and run.poll() is None, "the paused run waits"
    overview = json.loads(run_cli("status", "--json", env=env).stdout)["jobs"]["birthday"]
    assert overview["paused"][0]["reason"] == "SES complaint rate"
    [live] = overview["running"]
    assert live["pid"] == run.pid and live["counts"].get("paused") is True
    month = json.loads(run_cli("status", "--month", "2025-06", "--json", env=env).stdout)
    assert month["paused"] is True and month["paused_reason"] == "SES complaint rate"
    claims = query(
        db_url,
        "SELECT COUNT(*) FROM batchrun_ledger WHERE state = 0 AND owner IS NOT NULL",
    )
    assert claims[0][0] > 0, "its claims are kept"

    # A second process started meanwhile exits at once, claims nothing.
    again = run_cli("birthday", "--month", "2025-07", "--json", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["paused"] is True
    assert query(db_url, "SELECT COUNT(*) FROM batchrun_ledger WHERE period = '2025-07'") == [(0,)]
    # A dry run still previews the month, and says the run it previews would do nothing.
    preview = run_cli("birthday", "--month", "2025-07", "--dry-run", "--json", env=env)
    assert preview.returncode == 0, preview.stderr
    planned = json.loads(preview.stdout)
    assert planned["paused"] is True and planned["eligible"] == _eligible(db_url, 7), planned
    assert "is paused: a run now would do nothing" in preview.stderr
    assert query(db_url, "SELECT COUNT(*) FROM batchrun_ledger WHERE period = '2025-07'") == [(0,)]

    assert run_cli("resume", "birthday", env=env).returncode == 0
    smtp_server.set_latency(0)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert json.loads(out)["stopped"] is None
    assert len(smtp_server.sends_per_user()) == len(smtp_server.messages) == want


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}"}
    bad_since = run_cli("runs", "--since", "last tuesday", env=env)
    assert bad_since.returncode == 2 and "--since" in bad_since.stderr
    bad_period = run_cli("pause", "birthday", "--period", "2025-13", env=env)
    assert bad_period.returncode == 2 and "--period" in bad_period.stderr
    unknown = run_cli("cancel", "nosuch", env=env)
    assert unknown.returncode == 2 and "unknown job 'nosuch'" in unknown.stderr
    assert "Traceback" not in bad_since.stderr + bad_period.stderr + unknown.stderr


def test_runs_of_a_job_nobody_knows_is_a_usage_error(tmp_path: Path) -> None:
    """``runs birthdya`` said "no runs recorded yet", exit 0, as did a --since that matched
    nothing; status, why and cancel said "unknown job" (exit 2)."""
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    typo = run_cli("runs", "birthdya", env=env)
    assert (
        typo.returncode == 2 and "unknown job 'birthdya' (did you mean 'birthday'?)" in typo.stderr
    )
    none_yet = run_cli("runs", "birthday", env=env)
    assert (none_yet.returncode, none_yet.stdout.strip()) == (0, "no runs recorded yet")
    later = run_cli("runs", "birthday", "--since", "2099-01-01", env=env)
    assert (later.returncode, later.stdout.strip()) == (0, "no runs since 2099-01-01")
    # A job none of these processes loads, whose runs the history has: they are listed,
    # and a --since that leaves none out is no usage error.
    query(
        env["BATCHRUN_DB"],
        "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at, "
        "heartbeat_at, ended_at, exit_code, outcome) "
        "VALUES ('gone', '2025-06', 'run', 'h', 1, 'x', 1000, 1000, 2000, 0, 'ok')",
    )
    assert len(json.loads(run_cli("runs", "gone", "--json", env=env).stdout)) == 1
    since = run_cli("runs", "gone", "--since", "2099-01-01", "--json", env=env)
    assert (since.returncode, since.stdout.strip()) == (0, "[]"), since.stderr


def test_steering_nothing_says_so(tmp_path: Path) -> None:
    """A cancel with no run going on said it "cancelled the running birthday runs"; a
    resume of a job not paused said "birthday  was not paused"; a paused run's table said
    "paused True"."""
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    cancel = run_cli("cancel", "birthday", env=env)
    assert cancel.returncode == 0
    assert cancel.stderr.startswith("no run or worker is going on now"), cancel.stderr
    # A worker going on (no job of its own) may be doing the job's work: the cancel
    # reaches it, and says so.
    now = int(time.time() * 1000)
    query(
        env["BATCHRUN_DB"],
        "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at, "
        "heartbeat_at, outcome) VALUES (NULL, NULL, 'worker', 'h', 1, 'x', %s, %s, 'running')",
        now,
        now,
    )
    cancel = run_cli("cancel", "birthday", env=env)
    assert cancel.stderr.startswith("cancelled birthday: what works on it now stops"), cancel.stderr
    assert "(1 run going on)" in cancel.stderr
    resume = run_cli("resume", "birthday", env=env)
    assert resume.stderr.strip() == "birthday was not paused"
    # Resuming one period of two said the job "stays paused for every period".
    for month in ("2025-08", "2025-09"):
        assert run_cli("pause", "birthday", "--period", month, env=env).returncode == 0
    one = run_cli("resume", "birthday", "--period", "2025-08", env=env)
    assert one.stderr.splitlines() == [
        "resumed birthday 2025-08",
        "birthday stays paused for 2025-09: `batchrun resume birthday` clears them all",
    ], one.stderr
    assert run_cli("resume", "birthday", env=env).returncode == 0
    assert run_cli("pause", "birthday", "--period", "2025-07", env=env).returncode == 0
    held = run_cli("birthday", "--month", "2025-07", env=env)
    assert held.returncode == 0 and re.search(r"^paused +yes$", held.stdout, re.M), held.stdout


def test_the_scheduled_lambda_exits_at_once_while_paused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'b.db'}"
    env = {"BATCHRUN_DB": db, "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "200", env=env).returncode == 0
    assert run_cli("pause", "birthday", "--period", "2025-06", env=env).returncode == 0
    event = json.loads((ROOT / "tests" / "support" / "events" / "schedule.json").read_text())

    class Context:
        aws_request_id = "req-1"

        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    result = aws_lambda.handle(event, Context(), environ={**env, "BATCHRUN_FROM": "b@example.com"})
    assert result["paused"] is True and result["eligible"] == 0
    assert query(db, "SELECT COUNT(*) FROM batchrun_ledger") == [(0,)]
    [row] = _runs(env)
    assert (row["kind"], row["outcome"], row["period"]) == ("lambda", "ok", "2025-06")

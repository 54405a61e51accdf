"""A run killed with SIGKILL mid-way, then rerun, completes the month exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from support import ROOT
from support.birthday import eligible_ids
from support.checks import assert_one_card_each
from support.cli import run_cli
from support.db import query
from support.smtp_server import SmtpTestServer

from batchrun.mail.base import valid_address

CONCURRENCY = 10


def _env(db_url: str, smtp_server: SmtpTestServer) -> dict[str, str]:
    return {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_LEASE_S": "2",
    }


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_sends_everyone_once(
    db_url: str,
    smtp_server: SmtpTestServer,
) -> None:
    env = _env(db_url, smtp_server)
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "4000", "--seed", "21", env=env).returncode == 0
    emails = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = 6"))
    want = {uid for uid in eligible_ids(db_url, 6) if valid_address(emails[uid])}

    smtp_server.set_latency(0.01)  # slow enough that the kill lands mid-month
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    victim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchrun",
            "birthday",
            "--month",
            "2025-06",
            "--concurrency",
            str(CONCURRENCY),
            "--json",
        ],
        env=full,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        smtp_server.wait_for_messages(len(want) // 4, timeout=60)
    finally:
        victim.kill()  # SIGKILL: no cleanup, claims left behind
        _, err = victim.communicate(timeout=10)
    sent_before = len(smtp_server.messages)
    assert 0 < sent_before < len(want), f"the kill should land mid-month: {err.decode()}"

    smtp_server.set_latency(0)
    started = time.monotonic()
    rerun = run_cli("birthday", "--month", "2025-06", "--json", env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert time.monotonic() - started < 60

    assert_one_card_each(db_url, want)
    per_user = smtp_server.sends_per_user()
    assert set(per_user) == want, "every eligible user got the email"
    duplicates = sum(n - 1 for n in per_user.values())
    assert duplicates <= CONCURRENCY, "duplicates only from the in-flight window"
    status = run_cli("status", "--month", "2025-06", "--json", env=env)
    assert '"pending": 0' in status.stdout


@pytest.mark.slow
def test_sigterm_stops_gracefully_and_the_next_run_finishes_at_once(
    sqlite_url: str,
    smtp_server: SmtpTestServer,
) -> None:
    env = _env(sqlite_url, smtp_server) | {"BATCHRUN_LEASE_S": "30"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "3000", "--seed", "22", env=env).returncode == 0
    emails = dict(query(sqlite_url, "SELECT id, email FROM user WHERE birth_month = 6"))
    want = {uid for uid in eligible_ids(sqlite_url, 6) if valid_address(emails[uid])}

    smtp_server.set_latency(0.02)
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchrun",
            "birthday",
            "--month",
            "2025-06",
            "--concurrency",
            str(CONCURRENCY),
            "--json",
        ],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    smtp_server.wait_for_messages(20, timeout=60)
    run.terminate()  # SIGTERM: finish in-flight users, leave the rest pending
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert "left pending" in err
    sent = len(smtp_server.messages)
    assert 0 < sent < len(want)

    # Claims were released, not left to expire: the 30 s lease is not waited for.
    smtp_server.set_latency(0)
    started = time.monotonic()
    rerun = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert time.monotonic() - started < 20
    per_user = smtp_server.sends_per_user()
    assert per_user == Counter(dict.fromkeys(want, 1)), "a graceful stop duplicates nothing"
    assert out.strip().startswith("{")

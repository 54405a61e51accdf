"""Leases on the database server's clock: a host whose clock runs ahead
does not take over claims a live run holds.

Two ``batchrun birthday --concurrency 10`` processes against one database, the second
started 0.5 s later under Debian's ``faketime -f +16s`` (its wall clock 16 s ahead: past
the 15 s lease). With leases on each client's wall clock the second took over every claim
of the first and 529 of 600 users got two emails; on the server's clock the duplicates
stay within the bound the design promises a run that loses its claims, ``--concurrency``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest
from support import ROOT
from support.birthday import want_ids
from support.checks import assert_one_card_each
from support.cli import run_cli
from support.smtp_server import SmtpTestServer
from support.tasks import effects, migrate_task_jobs

CONCURRENCY = 10
USERS = 7200  # about 600 born in June
SKEW = "+16s"  # the default lease is 15 s
SLOW_RUN = ("--concurrency", "2", "--json")

pytestmark = pytest.mark.skipif(shutil.which("faketime") is None, reason="needs faketime")


def env_for(db_url: str, mail_url: str) -> dict[str, str]:
    """A subprocess's environment: the default 15 s lease, no BATCHRUN_ variable inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env.update(
        BATCHRUN_DB=db_url,
        BATCHRUN_MAIL=mail_url,
        BATCHRUN_FROM="birthday@example.com",
        COLUMNS="400",
    )
    return env


def start(env: dict[str, str], *prefix: str) -> subprocess.Popen[str]:
    args = [*prefix, sys.executable, "-m", "batchrun", "birthday", "--month", "2025-06"]
    return subprocess.Popen(
        [*args, "--concurrency", str(CONCURRENCY), "--json"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = process.communicate(timeout=120)
    data: dict[str, Any] = json.loads(out) if out.strip() else {}
    return process.returncode, data, err


def batchrun_at(
    skew: str | None, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``python -m batchrun ARGS`` to its end, under ``faketime -f SKEW`` when given."""
    prefix = ["faketime", "-f", skew] if skew else []
    return subprocess.run(
        [*prefix, sys.executable, "-m", "batchrun", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_faketime_moves_the_venvs_python_clock() -> None:
    """The premise: faketime shifts time.time() of the interpreter the test starts."""
    shown = subprocess.run(
        ["faketime", "-f", SKEW, sys.executable, "-c", "import time; print(time.time())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert float(shown.stdout) - time.time() > 14


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("server", ["mysql", "postgresql"])
def test_a_second_run_on_a_host_16s_ahead_takes_no_live_claim(
    request: pytest.FixtureRequest, smtp_server: SmtpTestServer, server: str
) -> None:
    db_url = str(request.getfixturevalue("postgres_url" if server == "postgresql" else "mysql_url"))
    env = env_for(db_url, smtp_server.url)
    for step in (("db", "migrate"), ("db", "seed", "--users", str(USERS), "--seed", "20")):
        done = run_cli(*step, env={k: v for k, v in env.items() if k.startswith("BATCHRUN_")})
        assert done.returncode == 0, done.stderr
    want = want_ids(db_url)
    assert len(want) > 500, "a month of about 600 users"
    smtp_server.set_latency(0.04)  # about 250 emails/s at concurrency 10: the runs overlap

    first = start(env)
    time.sleep(0.5)
    second = start(env, "faketime", "-f", SKEW)
    overlapped = first.poll() is None and len(smtp_server.messages) < len(want)
    code_a, summary_a, err_a = finish(first)
    code_b, summary_b, err_b = finish(second)

    assert overlapped, "the second run started while the first was mid-month"
    assert (code_a, code_b) == (0, 0), f"{err_a}\n{err_b}"
    per_user = smtp_server.sends_per_user(2025)
    duplicates = sum(n - 1 for n in per_user.values())
    print(
        f"{server}: {len(per_user)} users emailed, {duplicates} twice or more; "
        f"first {summary_a.get('emails_sent')} sent, second {summary_b.get('emails_sent')}"
    )
    assert set(per_user) == want, "every eligible user emailed"
    assert duplicates <= CONCURRENCY, f"{duplicates} duplicate emails > --concurrency"
    assert_one_card_each(db_url, want)
    assert summary_a["emails_sent"] + summary_b["emails_sent"] == len(want) + duplicates


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("server", ["mysql", "postgresql"])
def test_hosts_a_minute_apart_see_a_run_alive_and_can_cancel_it(
    request: pytest.FixtureRequest, smtp_server: SmtpTestServer, server: str
) -> None:
    """A run's history row and a cancel are on the server's clock too: a host a minute
    ahead that starts a drain does not mark the live run 'crashed', nor reads it so; a
    cancel given on a host a minute behind stops it (on each host's clock, the first was
    marked crashed and the cancel, older than the run's start, was ignored)."""
    db_url = str(request.getfixturevalue("postgres_url" if server == "postgresql" else "mysql_url"))
    env = env_for(db_url, smtp_server.url)
    env["BATCHRUN_LEASE_S"] = "3"  # a heartbeat, and a look at the control rows, each second
    plain = {k: v for k, v in env.items() if k.startswith("BATCHRUN_")}
    for step in (("db", "migrate"), ("db", "seed", "--users", "2400", "--seed", "21")):
        done = run_cli(*step, env=plain)
        assert done.returncode == 0, done.stderr
    smtp_server.set_latency(0.1)  # about 20 emails/s at concurrency 2: a run of ~10 s
    run = subprocess.Popen(
        [sys.executable, "-m", "batchrun", "birthday", "--month", "2025-06", *SLOW_RUN],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def cli(skew: str | None, *args: str) -> subprocess.CompletedProcess[str]:
        return batchrun_at(skew, env, *args)

    def birthday_run(skew: str | None) -> dict[str, Any]:
        listed = cli(skew, "runs", "birthday", "--json")
        assert listed.returncode == 0, listed.stderr
        [row] = [r for r in json.loads(listed.stdout) if r["kind"] == "run"]
        return dict(row)

    deadline = time.monotonic() + 30
    while len(smtp_server.messages) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run.poll() is None and len(smtp_server.messages) >= 5, "the run is under way"
    drained = cli("+60s", "retry", "--json")  # a start: it marks dead runs' rows crashed
    assert drained.returncode == 0, drained.stderr
    assert birthday_run(None)["outcome"] == "running"
    assert birthday_run("+60s")["outcome"] == "running"
    cancelled = cli("-60s", "cancel", "birthday", "--period", "2025-06")
    assert cancelled.returncode == 0, cancelled.stderr
    code, summary, err = finish(run)
    assert code == 130 and summary["stopped"] == "cancelled", f"{code} {summary} {err}"
    assert summary["left_pending"] > 0, "stopped before the month was done"
    ended = birthday_run(None)
    assert (ended["outcome"], ended["exit_code"]) == ("cancelled", 130)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("server", ["mysql", "postgresql"])
def test_tasks_submitted_on_hosts_a_minute_apart_run_at_once_and_age_alike(
    request: pytest.FixtureRequest, server: str
) -> None:
    """The table queue's times and a task's submission time are on the server's clock: a
    task submitted on a host a minute ahead is run at once by a worker on another host (on
    each host's clock its message stayed hidden for that minute), and one submitted on a
    host a minute behind does not look lost, and get sent twice, as soon as it is there."""
    db_url = str(request.getfixturevalue("postgres_url" if server == "postgresql" else "mysql_url"))
    env = {**migrate_task_jobs(db_url), "BATCHRUN_TASK_RESEND_S": "30"}

    def cli(skew: str | None, *args: str) -> subprocess.CompletedProcess[str]:
        return batchrun_at(skew, {**os.environ, **env}, *args)

    ahead = cli("+60s", "submit", "steps", "--id", "1", "--key", "a1")
    behind = cli("-60s", "submit", "steps", "--id", "2", "--key", "b1")
    assert (ahead.returncode, behind.returncode) == (0, 0), ahead.stderr + behind.stderr
    again = cli(None, "submit", "steps", "--id", "2", "--key", "b1", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["queued"] is False, "b1 is 0 s old, not 60: not lost"
    served = cli(None, "worker", "--idle-exit", "1", "--json")
    assert served.returncode == 0, served.stderr
    assert sorted(str(row[1]) for row in effects(db_url)) == ["a1", "b1"]

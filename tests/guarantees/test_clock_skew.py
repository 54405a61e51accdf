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

CONCURRENCY = 10
USERS = 7200  # about 600 born in June
SKEW = "+16s"  # the default lease is 15 s

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

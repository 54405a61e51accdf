"""The soak with a skewed clock and lost replies: ``make soak``, never CI.

Skipped unless ``BATCHRUN_SOAK=1``. Each iteration is its own year of June on MariaDB and
on PostgreSQL: two ``birthday --concurrency 10`` runs through a TCP proxy on loopback
(``tcp_proxy.py``) that drops the reply of a share of the statements naming
``batchrun_ledger`` or ``gift_card`` (batchrun's own and the job's), the second run started
0.5 s after the first under ``faketime`` with its clock past the lease ahead; then a rerun
and a retry drain straight to the server. Invariants: one card each, every eligible user
emailed, the ledger consistent, nothing left claimed (0 lost), and duplicates at most
``--concurrency`` for each run that ended on an error or lost claims. Sizes from the
environment: ``BATCHRUN_SOAK_ITERATIONS`` (100), ``BATCHRUN_SOAK_SKEW_LEASE_S`` (4, the
lease), ``BATCHRUN_SOAK_SKEW`` (``+5s``), ``BATCHRUN_SOAK_DROP_CHANCE`` (0.02).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from support import ROOT
from support.birthday import eligible_ids, want_ids
from support.checks import assert_month_complete
from support.cli import cli_env, cli_seed_users, run_cli
from support.smtp_server import SmtpTestServer
from support.tcp_proxy import TcpProxy

SOAK = os.environ.get("BATCHRUN_SOAK") == "1"
pytestmark = [
    pytest.mark.skipif(not SOAK, reason="long variants: BATCHRUN_SOAK=1 (make soak)"),
    pytest.mark.skipif(shutil.which("faketime") is None, reason="needs faketime"),
]

ITERATIONS = int(os.environ.get("BATCHRUN_SOAK_ITERATIONS", "100"))
LEASE_S = os.environ.get("BATCHRUN_SOAK_SKEW_LEASE_S", "4")
SKEW = os.environ.get("BATCHRUN_SOAK_SKEW", "+5s")
DROP_CHANCE = float(os.environ.get("BATCHRUN_SOAK_DROP_CHANCE", "0.02"))
SEED = int(os.environ.get("BATCHRUN_TEST_SEED", "20250607"))
CONCURRENCY = 10


@dataclass
class SkewReport:
    seed: int
    lease_s: float
    skew: str
    drop_chance: float
    iterations: int = 0
    eligible: int = 0
    replies_dropped: int = 0
    exits: dict[str, int] | None = None
    unknown_outcome: int = 0
    lost_claims: int = 0
    troubled_runs: int = 0  # ended on an error or lost claims: each may duplicate
    duplicates: int = 0
    duplicate_bound_total: int = 0
    lost: int = 0
    duration_s: float = 0.0


def _start(env: dict[str, str], month: str, *prefix: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    args = ["birthday", "--month", month, "--concurrency", str(CONCURRENCY), "--json"]
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "batchrun", *args],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ended(process: subprocess.Popen[str], where: str) -> tuple[int, dict[str, Any], str]:
    out, err = process.communicate(timeout=300)
    assert out.strip(), f"{where}: no JSON summary (exit {process.returncode}): {err}"
    assert "Traceback" not in err, f"{where}: {err}"
    data: dict[str, Any] = json.loads(out)
    if process.returncode == 1:
        assert "error" in data, f"{where}: {data}"
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"{where}: {err}"
    else:
        assert process.returncode in (0, 3), f"{where}: exit {process.returncode}: {err}"
    return process.returncode, data, err


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_soak_two_runs_one_skewed_through_a_reply_dropping_proxy(
    server_url: str, smtp_server: SmtpTestServer
) -> None:
    rng = random.Random(SEED)
    env = cli_env(server_url, smtp_server.url, BATCHRUN_LEASE_S=LEASE_S)
    cli_seed_users(server_url, env, 6000, SEED)
    want = want_ids(server_url)
    eligible = eligible_ids(server_url, 6)
    report = SkewReport(SEED, float(LEASE_S), SKEW, DROP_CHANCE, eligible=len(eligible))
    exits: dict[str, int] = {}
    started = time.monotonic()
    parts = urlsplit(server_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy:
        proxied = {**env, "BATCHRUN_DB": proxy.url_for(server_url)}
        for i in range(ITERATIONS):
            year = 2200 + i
            month = f"{year}-06"
            where = f"seed={SEED} iteration={i} month={month}"
            smtp_server.reset()
            smtp_server.set_latency(0.02)
            proxy.clear()
            before = proxy.dropped
            for marker in (b"batchrun_ledger", b"gift_card"):
                proxy.drop_reply(marker, times=10**6, chance=DROP_CHANCE, seed=rng.randrange(2**32))
            first = _start(proxied, month)
            time.sleep(0.5)
            second = _start(proxied, month, "faketime", "-f", SKEW)
            troubled = 0
            for process in (first, second):
                code, data, _ = _ended(process, where)
                exits[str(code)] = exits.get(str(code), 0) + 1
                report.unknown_outcome += int(data.get("unknown_outcome", 0))
                report.lost_claims += int(data.get("lost_claims", 0))
                troubled += code == 1 or int(data.get("lost_claims", 0)) > 0
            proxy.clear()
            report.replies_dropped += proxy.dropped - before
            report.troubled_runs += troubled

            smtp_server.set_latency(0)
            rerun = run_cli("birthday", "--month", month, "--json", env=env, timeout=300)
            assert rerun.returncode in (0, 3), f"{where}: {rerun.stderr}"
            drained = run_cli("retry", "--json", env=env, timeout=300)
            assert drained.returncode == 0, f"{where}: {drained.stderr}"
            per_user = smtp_server.sends_per_user(year)
            report.lost += len(want - set(per_user))
            bound = CONCURRENCY * troubled
            report.duplicates += assert_month_complete(
                server_url,
                smtp_server,
                year=year,
                want=want,
                skipped=len(eligible - want),
                max_duplicates=bound,
                where=f"{where} (troubled runs {troubled})",
            )
            report.duplicate_bound_total += bound
            report.iterations += 1
    report.exits = exits
    report.duration_s = round(time.monotonic() - started, 1)
    print(
        f"\nSOAK skewed clock + lost replies ({server_url.split(':')[0]}): "
        f"{json.dumps(asdict(report))}"
    )
    assert report.iterations == ITERATIONS
    assert report.lost == 0
    assert report.replies_dropped > 0, "the proxy dropped replies"

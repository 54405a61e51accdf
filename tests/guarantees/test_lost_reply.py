"""Lost replies: batchrun never runs a job's statement again after its
reply was lost, and a re-run of its own ``finish`` is not mistaken for a lost claim.

A TCP proxy on loopback (``tcp_proxy.py``) stands between a ``batchrun`` subprocess and the
real MariaDB or PostgreSQL server: it forwards the marked statement, which runs and
commits, then drops the server's reply and closes the connection.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support import ROOT
from support.cli import run_cli
from support.credit_job import CREDIT, TABLE
from support.db import query
from support.tcp_proxy import TcpProxy

JOB = str(ROOT / "tests" / "support" / "credit_job.py")
MONTH = "2025-06"


@pytest.fixture
def proxy(server_url: str) -> Any:
    parts = urlsplit(server_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0) as running:
        yield running


def dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgres") else "mysql"


def reply_tag(url: str) -> bytes | None:
    """Which reply holds an UPDATE's result: asyncpg's second (after Parse, Describe)."""
    return b"UPDATE" if dialect(url) == "postgresql" else None


def accounts(url: str, count: int) -> None:
    query(url, TABLE[dialect(url)])
    values = ", ".join(f"({i}, 0)" for i in range(1, count + 1))
    query(url, f"INSERT INTO account (id, balance) VALUES {values}")


def balances(url: str) -> dict[int, int]:
    return {int(i): int(b) for i, b in query(url, "SELECT id, balance FROM account")}


def ledger(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT entity_id, state, owner FROM batchrun_ledger ORDER BY entity_id")


def cli(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "BATCHRUN_DB": url,
        "BATCHRUN_JOBS": JOB,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_LEASE_S": "3",
        "BATCHRUN_RETRY_BASE_S": "0",
    }
    return run_cli(*args, env=env)


def summary(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.stdout.strip(), f"exit {result.returncode}: {result.stderr}"
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_job_statement_whose_reply_is_lost_is_applied_once(
    server_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    accounts(server_url, 5)
    migrated = cli(server_url, tmp_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert b"balance = balance + 10" in CREDIT.encode()
    proxy.drop_reply(b"balance = balance + 10", reply_contains=reply_tag(server_url))

    run = cli(proxy.url_for(server_url), tmp_path, "run", "credit", "--period", MONTH, "--json")
    assert proxy.dropped == 1, "the proxy lost the UPDATE's reply"
    assert balances(server_url) == dict.fromkeys(range(1, 6), 10), "applied exactly once"
    data = summary(run)
    assert run.returncode == 3, run.stderr
    assert (data["unknown_outcome"], data["queued_for_retry"], data["succeeded"]) == (1, 1, 4)
    assert "Traceback" not in run.stderr, run.stderr

    # The entity is retried as a whole: the job's key shows the credit is there already.
    retry = cli(proxy.url_for(server_url), tmp_path, "retry", "--json")
    assert retry.returncode == 0, retry.stderr
    assert summary(retry)["remaining"] == 0
    assert balances(server_url) == dict.fromkeys(range(1, 6), 10), "and once after the retry"
    assert [(r[1], r[2]) for r in ledger(server_url)] == [(1, None)] * 5


def test_a_lone_run_whose_finish_reply_is_lost_reports_no_lost_claims(
    server_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    accounts(server_url, 50)
    migrated = cli(server_url, tmp_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    proxy.drop_reply(b"attempts = attempts + 1", reply_contains=reply_tag(server_url))

    run = cli(proxy.url_for(server_url), tmp_path, "run", "credit", "--period", MONTH, "--json")
    assert proxy.dropped == 1, "the proxy lost a finish's reply"
    data = summary(run)
    assert run.returncode == 0, run.stderr
    assert (data["lost_claims"], data["succeeded"], data["failed"]) == (0, 50, 0), data
    assert "taken over" not in run.stderr, run.stderr
    assert balances(server_url) == dict.fromkeys(range(1, 51), 10)
    assert [(r[1], r[2]) for r in ledger(server_url)] == [(1, None)] * 50

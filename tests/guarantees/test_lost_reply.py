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
from support.tasks import effects, migrate_task_jobs
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


def reply_tag(url: str, tag: bytes = b"UPDATE") -> bytes | None:
    """Which reply holds the statement's result: asyncpg's second (after Parse, Describe)."""
    return tag if dialect(url) == "postgresql" else None


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


def test_a_submit_whose_insert_reply_is_lost_still_queues_its_task(
    server_url: str, proxy: TcpProxy
) -> None:
    """The submission's insert went again after its reply was lost, found the row its
    first run had written, and took it for an earlier submission of the key: "submitted
    before: nothing queued", and the task waited for the lost-task sweep (5 min)."""
    env = migrate_task_jobs(server_url)
    insert = b"INSERT IGNORE INTO" if dialect(server_url) == "mysql" else b"INSERT INTO"
    proxy.drop_reply(
        insert + b" batchrun_entity_task", reply_contains=reply_tag(server_url, b"INSERT")
    )

    env["BATCHRUN_DB"] = proxy.url_for(server_url)
    sent = run_cli("submit", "steps", "--id", "3", "--key", "k1", "--json", env=env)
    assert proxy.dropped == 1, "the proxy lost the insert's reply"
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["queued"] is True, sent.stdout
    again = run_cli("submit", "steps", "--id", "3", "--key", "k1", "--json", env=env)
    assert json.loads(again.stdout)["queued"] is False, "a second submission is a no-op"

    served = run_cli("worker", "--idle-exit", "1", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    assert [r[1] for r in effects(server_url)] == ["k1"], "run once, without the sweep"


# -- no reply at all: the connection stays open, the reply never comes -----------------------


def silent_url(proxy: TcpProxy, server_url: str) -> str:
    """The proxy's URL with a short reply deadline (the default is 60 s)."""
    return proxy.url_for(server_url) + "?reply_timeout=2"


def test_batchrun_s_own_statement_that_never_gets_a_reply_goes_again_after_reply_timeout(
    server_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    """A finish whose reply never comes, on a connection that stays open (a network that
    drops packets without a reset): the run waited forever, its heartbeat keeping its claims
    from every other run, and SIGTERM did not end it. Now the connection is closed after
    the URL's reply_timeout and the finish goes again on another one."""
    accounts(server_url, 50)
    migrated = cli(server_url, tmp_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    proxy.silence(b"attempts = attempts + 1")

    run = cli(silent_url(proxy, server_url), tmp_path, "run", "credit", "--period", MONTH, "--json")
    assert proxy.silenced == 1, "the proxy silenced a finish's connection"
    data = summary(run)
    assert run.returncode == 0, run.stderr
    assert (data["succeeded"], data["failed"], data["lost_claims"]) == (50, 0, 0), data
    assert "no reply in 2 s" in run.stderr, run.stderr
    assert balances(server_url) == dict.fromkeys(range(1, 51), 10)
    assert [(r[1], r[2]) for r in ledger(server_url)] == [(1, None)] * 50


def test_a_job_statement_that_never_gets_a_reply_is_an_unknown_outcome_after_reply_timeout(
    server_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    """A job's statement without a reply is never run again alone: after reply_timeout its
    outcome is unknown, as for a lost reply, and the entity goes to the retry queue."""
    accounts(server_url, 5)
    migrated = cli(server_url, tmp_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    proxy.silence(b"balance = balance + 10")

    run = cli(silent_url(proxy, server_url), tmp_path, "run", "credit", "--period", MONTH, "--json")
    assert proxy.silenced == 1
    data = summary(run)
    assert run.returncode == 3, run.stderr
    assert (data["unknown_outcome"], data["queued_for_retry"], data["succeeded"]) == (1, 1, 4)
    # Ran once (MariaDB: the statement went whole) or not at all (asyncpg waits for its
    # Parse's reply before it sends the statement to run): never twice.
    assert set(balances(server_url).values()) <= {0, 10}, balances(server_url)

    retry = cli(silent_url(proxy, server_url), tmp_path, "retry", "--json")
    assert retry.returncode == 0, retry.stderr
    assert balances(server_url) == dict.fromkeys(range(1, 6), 10), "once after the retry"
    assert [(r[1], r[2]) for r in ledger(server_url)] == [(1, None)] * 5


def test_a_run_the_database_stops_answering_counts_only_what_the_ledger_recorded(
    server_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    """The outcome writes never reach the database: the run ends on an error after its
    tries. Its summary said `succeeded` for entities worked whose outcome was never
    written (the ledger had fewer, and a rerun worked those again); now they are
    `unrecorded`, and a line says a rerun works again what the ledger does not have."""
    accounts(server_url, 5)
    migrated = cli(server_url, tmp_path, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    proxy.close_before(b"attempts = attempts + 1", times=100)

    url = proxy.url_for(server_url)
    run = cli(url, tmp_path, "run", "credit", "--period", MONTH, "--concurrency", "1", "--json")
    data = summary(run)
    assert run.returncode == 1 and "error" in data, run.stderr
    recorded = sum(1 for r in ledger(server_url) if r[1] == 1)
    worked = sum(1 for b in balances(server_url).values() if b == 10)
    assert (data["succeeded"], data["unrecorded"]) == (recorded, worked - recorded), data
    assert data["unrecorded"] == 1, data
    assert "1 entities were worked but the run ended before their outcome" in run.stderr


def test_a_bad_reply_timeout_is_one_line_before_connecting(server_url: str, tmp_path: Path) -> None:
    run = cli(server_url + "?reply_timeout=soon", tmp_path, "db", "migrate")
    assert run.returncode == 2, run.stderr
    assert "bad reply_timeout" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr

"""Fan-out over SQS: a producer and three `batchrun worker` processes (MariaDB, moto, SMTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from support import ROOT
from support.aws_server import MotoServer, make_queue_with_dlq
from support.birthday import eligible_ids
from support.checks import assert_one_card_and_one_email_each, assert_one_card_each
from support.cli import run_cli
from support.db import query
from support.smtp_server import SmtpTestServer

from batchrun.mail.base import valid_address

WORKER_CONCURRENCY = 10


@pytest.fixture
def queue_url(moto_server: MotoServer) -> str:
    moto_server.reset()
    url, _ = make_queue_with_dlq(moto_server, "fanout", dlq_name="fanout-dlq", visibility_s=4)
    return url


@pytest.fixture
def env(
    mysql_url: str, smtp_server: SmtpTestServer, moto_server: MotoServer, queue_url: str
) -> dict[str, str]:
    return {
        **moto_server.env,
        "BATCHRUN_DB": mysql_url,
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_RETRY_QUEUE": queue_url,  # one queue: shards, retries and hand-offs
        "BATCHRUN_LEASE_S": "2",
    }


def month_of(db_url: str, env: dict[str, str], users: int, seed: int) -> set[int]:
    assert run_cli("db", "migrate", env=env).returncode == 0
    seeded = run_cli("db", "seed", "--users", str(users), "--seed", str(seed), env=env)
    assert seeded.returncode == 0, seeded.stderr
    emails = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = 6"))
    return {uid for uid in eligible_ids(db_url, 6) if valid_address(emails[uid])}


def produce(env: dict[str, str], queue_url: str) -> dict[str, Any]:
    done = run_cli(
        "birthday",
        "--month",
        "2025-06",
        "--fan-out",
        queue_url,
        "--shard-size",
        "150",
        "--json",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def start_worker(env: dict[str, str], idle_exit: float) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchrun",
            "worker",
            "--concurrency",
            str(WORKER_CONCURRENCY),
            "--visibility",
            "4",
            "--idle-exit",
            str(idle_exit),
            "--json",
        ],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_producer_and_three_workers_complete_the_month(
    mysql_url: str,
    env: dict[str, str],
    queue_url: str,
    smtp_server: SmtpTestServer,
) -> None:
    want = month_of(mysql_url, env, 20_000, seed=51)
    queued = produce(env, queue_url)
    assert queued["users"] >= len(want) and queued["shards"] == -(-queued["users"] // 150)
    workers = [start_worker(env, idle_exit=3) for _ in range(3)]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err
        results.append(json.loads(out))
    assert sum(1 for r in results if r["succeeded"] > 0) >= 2, "the work should be shared"
    assert sum(r["succeeded"] for r in results) == len(want)
    assert_one_card_and_one_email_each(mysql_url, smtp_server, want)
    again = produce(env, queue_url)
    assert (again["shards"], again["users"]) == (0, 0), "a rerun queues no finished user"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_duplicate_shards_and_a_killed_worker_still_give_one_card_each(
    mysql_url: str,
    env: dict[str, str],
    queue_url: str,
    smtp_server: SmtpTestServer,
) -> None:
    want = month_of(mysql_url, env, 20_000, seed=52)
    first, second = produce(env, queue_url), produce(env, queue_url)
    assert first == {**second, "duration_s": first["duration_s"]}  # every shard sent twice
    smtp_server.set_latency(0.02)
    workers = [start_worker(env, idle_exit=8) for _ in range(3)]
    smtp_server.wait_for_messages(len(want) // 5, timeout=120)
    victim = workers[0]
    victim.kill()  # SIGKILL mid-shard: its claims expire, its message reappears
    victim.communicate(timeout=10)
    for worker in workers[1:]:
        _, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err
    assert_one_card_each(mysql_url, want)
    sends = smtp_server.sends_per_user()
    assert set(sends) == want, "every user emailed"
    duplicates = sum(n - 1 for n in sends.values())
    assert duplicates <= WORKER_CONCURRENCY, "only the killed worker's in-flight sends"
    status = run_cli("status", "--month", "2025-06", "--json", env=env)
    assert json.loads(status.stdout)["pending"] == 0

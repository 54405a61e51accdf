"""The task jobs of task_jobs.py in tests: their migration, what they did, and workers."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from batchrun.errors import QueueError
from batchrun.task import Task
from support import ROOT, SUPPORT
from support.cli import run_cli
from support.db import query

JOBS = str(SUPPORT / "task_jobs.py")
EFFECT = (
    "CREATE TABLE task_effect (entity_id BIGINT NOT NULL, task_key VARCHAR(200) NOT NULL,"
    " seq INT NOT NULL, started_ns BIGINT NOT NULL, ended_ns BIGINT NOT NULL, pid INT NOT NULL)"
)


def migrate_task_jobs(db_url: str) -> dict[str, str]:
    """`db migrate` with the task jobs of task_jobs.py, and the table they record effects in."""
    env = {"BATCHRUN_DB": db_url, "BATCHRUN_JOBS": JOBS, "BATCHRUN_MAIL": "console://"}
    migrated = run_cli("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    query(db_url, EFFECT)
    return env


def effects(db_url: str) -> list[tuple[Any, ...]]:
    """What the task jobs did: (entity, key, seq, started_ns, ended_ns) rows."""
    return query(db_url, "SELECT entity_id, task_key, seq, started_ns, ended_ns FROM task_effect")


def start_workers(env: dict[str, str], n: int, *args: str) -> list[subprocess.Popen[str]]:
    """``n`` ``batchrun worker`` processes that exit after 3 s idle (``args``: more of its
    options, which then take their stdout too)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    options = list(args) or ["--concurrency", "8"]
    return [
        subprocess.Popen(
            [sys.executable, "-m", "batchrun", "worker", "--idle-exit", "3", *options],
            env=full,
            cwd=ROOT,
            stdout=subprocess.PIPE if args else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]


class StepsTask(Task):
    """The ``steps`` task job, for calling ``submit`` directly (its tasks are not run)."""

    name = "steps"

    async def process(self, ctx: Any, task: Any) -> None:
        raise AssertionError("not run here")


class RefusingQueue:
    """A queue whose every send fails as an unreachable SQS's does."""

    url = "https://sqs.example/q"

    async def send(self, bodies: Any, *, delay_s: float = 0.0) -> None:
        raise QueueError("could not send to SQS queue https://sqs.example/q: refused")

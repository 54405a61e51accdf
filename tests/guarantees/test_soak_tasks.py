"""The crash soak for submitted tasks: kill -9 a worker mid-task, 0 lost; the duplicate
effects are bounded and counted.

N tasks over many entities (``steps`` of ``tests/support/task_jobs.py``: a short sleep, then its
interval written to ``task_effect``, so kills land mid-task and between the effect and the
task's end), served by ``WORKERS`` ``batchrun worker`` subprocesses; every 0.2-1.2 s one
of them, at random, gets SIGKILL and a new one takes its place, ``KILLS`` times; then the
survivors serve until every task has ended and get SIGTERM. Checked, on MariaDB and
PostgreSQL: every task succeeded (0 lost), each exactly once in the task table, one
entity's intervals never overlap and run in submission order, and the duplicate effects
(an effect written by a worker killed before it recorded the task's end, then run again)
are at most kills x ``--concurrency``; printed with ``pytest -s``.

A short version runs in ``make test`` (4 kills, 240 tasks); ``BATCHRUN_SOAK=1`` (``make
soak``) runs ``BATCHRUN_SOAK_TASK_KILLS`` (100) kills over ``BATCHRUN_SOAK_TASKS`` (20,000)
tasks. ``BATCHRUN_TEST_SEED`` replays another seed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import IO, Any

import pytest
from support import ROOT, SUPPORT
from support.cli import run_cli
from support.db import query

import batchrun

SOAK = os.environ.get("BATCHRUN_SOAK") == "1"
KILLS = int(os.environ.get("BATCHRUN_SOAK_TASK_KILLS", "100")) if SOAK else 4
TASKS = int(os.environ.get("BATCHRUN_SOAK_TASKS", "20000")) if SOAK else 240
PER_ENTITY = 4  # tasks an entity, submitted in a random order of entities
WORKERS = 3
CONCURRENCY = 4
LEASE_S = "3"
SEED = int(os.environ.get("BATCHRUN_TEST_SEED", "20261202"))
JOBS = str(SUPPORT / "task_jobs.py")
EFFECT = (
    "CREATE TABLE task_effect (entity_id BIGINT NOT NULL, task_key VARCHAR(200) NOT NULL,"
    " seq INT NOT NULL, started_ns BIGINT NOT NULL, ended_ns BIGINT NOT NULL, pid INT NOT NULL)"
)


class Workers:
    """The worker subprocesses, each logging to its own file."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        self.env.update(env)
        self.logs = logs
        self.live: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        self.started = 0

    def start(self) -> None:
        log = (self.logs / f"worker-{self.started}.log").open("wb")
        self.started += 1
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchrun",
                "worker",
                "--concurrency",
                str(CONCURRENCY),
                "--prefetch",
                str(2 * CONCURRENCY),  # batches claimed at once, several of an entity
                "--visibility",
                "3",
            ],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        self.live.append((proc, log))

    def kill_one(self, rng: random.Random) -> None:
        proc, log = self.live.pop(rng.randrange(len(self.live)))
        proc.kill()  # SIGKILL: no finally, no release, no last heartbeat
        proc.wait()
        log.close()

    def stop(self) -> list[int]:
        for proc, _ in self.live:
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc, log in self.live:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
            log.close()
        self.live = []
        return codes


def _running(db_url: str) -> int:
    rows = query(db_url, "SELECT COUNT(*) FROM batchrun_entity_task WHERE state = 1")
    return int(rows[0][0])


def _busy(db_url: str) -> int:
    """Tasks running now, once some are (or 0 after 3 s)."""
    deadline = time.monotonic() + 3
    while (n := _running(db_url)) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def _unfinished(db_url: str) -> int:
    rows = query(db_url, "SELECT COUNT(*) FROM batchrun_entity_task WHERE state <> 2")
    return int(rows[0][0])


@pytest.mark.timeout(7200 if SOAK else 300)
@pytest.mark.parametrize("server", ["mysql", "postgresql"])
def test_kill_9_workers_mid_task_loses_nothing_and_bounds_duplicates(
    server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    db_url: str = request.getfixturevalue("mysql_url" if server == "mysql" else "postgres_url")
    env = {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_JOBS": JOBS,
        "BATCHRUN_MAIL": "console://",
        "BATCHRUN_LEASE_S": LEASE_S,
    }
    migrated = run_cli("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    query(db_url, EFFECT)
    rng = random.Random(SEED)
    entities = TASKS // PER_ENTITY
    submitted: dict[int, list[str]] = defaultdict(list)
    order = [uid for uid in range(1, entities + 1) for _ in range(PER_ENTITY)]
    rng.shuffle(order)  # one entity's tasks near each other in the queue, in every batch
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        for uid in order:
            sleep = round(rng.uniform(0.01, 0.06), 3)
            key = client.submit("steps", uid, data={"seq": len(submitted[uid]), "sleep": sleep})
            submitted[uid].append(key)
    workers = Workers(env, tmp_path)
    started = time.monotonic()
    kills = 0
    running = 0  # tasks running (in any worker) at the moments of the kills
    try:
        for _ in range(WORKERS):
            workers.start()
        while kills < KILLS:
            time.sleep(rng.uniform(0.2, 1.2))
            if _unfinished(db_url) == 0:
                break  # all done before every kill: the rest would land on idle workers
            running += _busy(db_url)  # a kill lands while tasks run (up to 3 s to wait)
            workers.kill_one(rng)
            kills += 1
            workers.start()
        deadline = time.monotonic() + 300 + TASKS / 10
        while _unfinished(db_url) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        codes = workers.stop()
    elapsed = time.monotonic() - started
    logs = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("worker-*.log")))
    assert "Traceback" not in logs, logs[-3000:]
    assert codes == [0] * len(codes), logs[-3000:]

    states = dict(query(db_url, "SELECT state, COUNT(*) FROM batchrun_entity_task GROUP BY state"))
    rows = query(db_url, "SELECT entity_id, task_key, started_ns, ended_ns FROM task_effect")
    keys = {key for keys in submitted.values() for key in keys}
    done = {str(r[1]) for r in rows}
    lost = len(keys - done)
    duplicates = len(rows) - len(done)
    bound = kills * CONCURRENCY
    per_entity: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        per_entity[int(row[0])].append(row)
    overlaps = 0
    out_of_order = 0
    for uid, runs in per_entity.items():
        runs.sort(key=lambda r: int(r[2]))
        overlaps += sum(1 for a, b in pairwise(runs) if int(b[2]) < int(a[3]))
        first_seen = list(dict.fromkeys(str(r[1]) for r in runs))
        out_of_order += first_seen != submitted[uid]
    print(
        f"\ntask soak on {server}: {len(keys)} tasks over {entities} entities, {WORKERS} workers"
        f" (--concurrency {CONCURRENCY}), {kills} kills in {elapsed:.1f} s ({running} tasks"
        f" running at them); lost {lost},"
        f" duplicate effects {duplicates} (bound {bound}), overlaps {overlaps},"
        f" out of order {out_of_order}, task states {states}"
    )
    assert lost == 0
    assert states == {2: len(keys)}, states  # every task succeeded, none left or dead
    assert overlaps == 0
    assert out_of_order == 0
    assert duplicates <= bound

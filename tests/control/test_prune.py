"""``batchrun prune``: the run history and ended tasks older than a cutoff deleted, in
batches; a live run and an unfinished task kept whatever their age; a pruned key runs
again when submitted again."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from support.cli import run_cli
from support.db import query
from support.tasks import StepsTask, migrate_task_jobs

from batchrun.control import prune as pruning
from batchrun.queue.local import LocalQueue
from batchrun.tasks.store import TaskState, TaskStore
from batchrun.tasks.submit import submit

DAY_MS = 86_400_000


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _runs(store: Any, rows: list[tuple[str, int, int | None, str]]) -> None:
    """Run rows: (host, started_at, ended_at, outcome); the heartbeat is the end, or now
    for a live one (outcome running) and its start for a crashed one (host 'crashed')."""
    for host, started, ended, outcome in rows:
        beat = ended or (started if host == "crashed" else _now_ms())
        await store.db.execute_sql(
            "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at,"
            " heartbeat_at, ended_at, exit_code, outcome) VALUES"
            f" (NULL, NULL, 'worker', '{host}', 1, 'v', {started}, {beat},"
            f" {'NULL' if ended is None else ended}, NULL, '{outcome}')",
            (),
        )


async def _hosts(store: Any) -> list[str]:
    rows = await store.db.fetch_sql("SELECT host FROM batchrun_run ORDER BY id", ())
    return [str(r[0]) for r in rows]


async def _keys(store: Any) -> list[str]:
    rows = await store.db.fetch_sql("SELECT task_key FROM batchrun_entity_task ORDER BY id", ())
    return [str(r[0]) for r in rows]


async def _tasks(store: Any, ended_days_ago: dict[str, tuple[TaskState, float]]) -> None:
    tasks = TaskStore(store.db)
    for entity, (key, (state, days)) in enumerate(ended_days_ago.items(), start=1):
        assert await tasks.submit("steps", entity, key, "{}")
        if state is TaskState.PENDING:
            continue
        row = await tasks.get("steps", key)
        assert row is not None and await tasks.start(row.id, "A", 30.0)
        if state is not TaskState.RUNNING:
            assert await tasks.finish(row.id, "A", state, None)
        ended = _now_ms() - int(days * DAY_MS)
        await store.db.execute_sql(
            f"UPDATE batchrun_entity_task SET finished_at = {ended}, created_at = {ended}"
            f" WHERE task_key = '{key}'",
            (),
        )


async def test_old_history_and_ended_tasks_go_in_batches(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pruning, "BATCH", 2)  # several statements, read on from the last id
    old, recent = _now_ms() - 100 * DAY_MS, _now_ms() - DAY_MS
    await _runs(
        store,
        [
            ("old1", old, old + 5000, "ok"),
            ("old-live", old, None, "running"),  # started long ago, its heartbeat is now
            ("old2", old, old + 5000, "failed"),
            ("crashed", old, None, "running"),  # no heartbeat since: over
            ("recent", recent, recent + 5000, "ok"),
            ("old3", old, old + 5000, "failed"),  # the newest failure: kept, however old
            ("live", recent, None, "running"),
        ],
    )
    await _tasks(
        store,
        {
            "done-old": (TaskState.SUCCEEDED, 100),
            "dead-old": (TaskState.DEAD, 100),
            "failed-old": (TaskState.FAILED, 100),  # waits for its retry: kept
            "running-old": (TaskState.RUNNING, 100),
            "pending": (TaskState.PENDING, 100),
            "done-recent": (TaskState.SUCCEEDED, 1),
            "done-old-2": (TaskState.SUCCEEDED, 100),
        },
    )
    cutoff = _now_ms() - 90 * DAY_MS
    counted = await pruning.prune(store.db, runs_before=cutoff, tasks_before=cutoff, dry_run=True)
    assert (counted.runs, counted.tasks) == (3, 3)
    assert len(await _hosts(store)) == 7  # a dry run deletes nothing
    pruned = await pruning.prune(store.db, runs_before=cutoff, tasks_before=cutoff)
    assert (pruned.runs, pruned.tasks) == (3, 3)
    assert await _hosts(store) == ["old-live", "recent", "old3", "live"]
    everything = await pruning.prune(store.db, runs_before=_now_ms() + DAY_MS, tasks_before=None)
    assert everything.runs == 0  # a cutoff in the future: the live ones and newest kept
    assert await _keys(store) == ["failed-old", "running-old", "pending", "done-recent"]
    again = await pruning.prune(store.db, runs_before=cutoff, tasks_before=None)
    assert (again.runs, again.tasks) == (0, 0)


async def test_the_last_real_success_is_kept_behind_a_paused_run(store: Any) -> None:
    """A run that found its job paused ends `ok` but is no success to the metrics: prune
    kept it as the newest `ok` and deleted the real success before it, and
    `batchrun_last_success_timestamp_seconds` vanished (an alert on it never fired)."""
    old = _now_ms() - 100 * DAY_MS
    for host, counts in (
        ("real-old", '{"succeeded":3}'),
        ("real", '{"succeeded":5}'),
        ("paused", '{"succeeded":0,"paused":true}'),
    ):
        await store.db.execute_sql(
            "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at,"
            " heartbeat_at, ended_at, exit_code, outcome, counts) VALUES"
            f" ('birthday', '2025-06', 'run', '{host}', 1, 'v', {old}, {old}, {old}, 0, 'ok',"
            f" '{counts}')",
            (),
        )
    pruned = await pruning.prune(store.db, runs_before=_now_ms(), tasks_before=None)
    assert pruned.runs == 1 and await _hosts(store) == ["real", "paused"]
    last = await store.db.fetchall("metrics_last_runs")
    assert [(r[0], r[1]) for r in last] == [("birthday", "ok")], last


async def test_a_pruned_key_submitted_again_runs_again(store: Any) -> None:
    await _tasks(store, {"k1": (TaskState.SUCCEEDED, 100)})
    queue = LocalQueue(store.db)
    kept = await submit(store.db, queue, StepsTask(), 1, key="k1", resend_after_s=300)
    assert not kept.queued  # a key submitted before is a no-op ...
    await pruning.prune(store.db, runs_before=None, tasks_before=_now_ms() - DAY_MS)
    fresh = await submit(store.db, queue, StepsTask(), 1, key="k1", resend_after_s=300)
    assert fresh.queued  # ... until its row is pruned


def test_the_cli_counts_prunes_and_refuses_a_bad_age(db_url: str) -> None:
    env = migrate_task_jobs(db_url)
    old = _now_ms() - 100 * DAY_MS
    for _ in range(2):  # the second, the job's newest success, is kept
        query(
            db_url,
            "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at,"
            " heartbeat_at, ended_at, exit_code, outcome) VALUES"
            f" ('steps', NULL, 'run', 'h', 1, 'v', {old}, {old}, {old}, 0, 'ok')",
        )
    dry = run_cli("prune", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    said = json.loads(dry.stdout)
    assert (said["runs"], said["tasks"], said["dry_run"]) == (1, 0, True), said
    assert said["runs_before"].endswith("Z") and said["tasks_before"].endswith("Z")
    kept = run_cli("prune", "--runs", "never", "--tasks", "never", env=env)
    assert kept.returncode == 0 and "nothing" in kept.stdout, kept.stdout
    done = run_cli("prune", "--runs", "30d", env=env)
    assert done.returncode == 0, done.stderr
    assert "deleted 1 run over before" in done.stdout, done.stdout
    assert query(db_url, "SELECT COUNT(*) FROM batchrun_run")[0][0] == 1
    bad = run_cli("prune", "--tasks", "soon", env=env)
    assert bad.returncode == 2 and "--tasks" in bad.stderr and "7d" in bad.stderr, bad.stderr

"""`batchrun why` and the dashboard for a task job: the entity's submitted tasks
(succeeded, dead, failed with its retry time), its waiting message and the worker run
that did each step; the job's tasks by state and the workers that ran them; on SQLite,
MariaDB and PostgreSQL."""

from __future__ import annotations

import html
import json
import urllib.request
from typing import Any

from support.cli import run_cli
from support.db import query
from support.tasks import JOBS, migrate_task_jobs
from support.ui import serve

import batchrun
from batchrun.control.task_story import MAX_TASKS, task_events
from batchrun.tasks.store import TaskState, TaskStore


def test_a_task_entitys_story(db_url: str) -> None:
    env = migrate_task_jobs(db_url)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        client.submit("flaky", 5, key="t1")  # fails once, then succeeds
        client.submit("flaky", 5, key="t2", data={"fail": "always"})  # dead
        client.submit("flaky", 5, key="t3", data={"retry_s": 9})  # failed, its retry waits
    served = run_cli("worker", "--idle-exit", "2", env=env, timeout=120)
    assert served.returncode in (0, 1), served.stderr
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        client.submit("flaky", 5, key="t4")  # the newest: pending, behind t3
    # An events drain (it serves every job, but runs no task) overlapping every step: it
    # is the newest run, and must not be taken for the one that ran the tasks.
    query(
        db_url,
        "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at,"
        " heartbeat_at, ended_at, exit_code, outcome) VALUES"
        " (NULL, NULL, 'events', 'h', 1, 'v', 0, 4000000000000, 4000000000000, 0, 'ok')",
    )

    told = run_cli("why", "flaky", "5", "--json", env=env)
    assert told.returncode == 0, told.stderr
    story = json.loads(told.stdout)
    # t3, whose retry waits, is the one whose turn it is (t4, the newest, waits behind it)
    assert (story["state"], story["eligible"]) == ("failed", True)
    steps = {(e["what"], e["detail"].split(",")[0].split(":")[0]): e for e in story["events"]}
    assert steps[("task succeeded", "key t1")]["detail"] == "key t1, after 2 attempts"
    assert "told to fail" in steps[("task dead", "key t2")]["detail"]
    failed = steps[("task failed", "key t3")]["detail"]
    assert "first attempt fails" in failed and "tried again from" in failed, failed
    waiting = [e["detail"] for e in story["events"] if e["what"] == "entity_task message waiting"]
    assert len(waiting) == 2 and "(entity_task, key t3)" in waiting[0], waiting
    worker_run = query(db_url, "SELECT id FROM batchrun_run WHERE kind = 'worker'")[0][0]
    assert steps[("task succeeded", "key t1")]["run_id"] == worker_run  # not the drain's
    assert steps[("task submitted", "key t1")]["run_id"] is None  # an application's doing
    whats = [e["what"] for e in story["events"]]
    assert "no ledger row" not in whats and "not eligible now" not in whats

    runs = json.loads(run_cli("runs", "flaky", "--json", env=env).stdout)
    assert [r["kind"] for r in runs] == ["worker"], runs  # it ran them; the drain did not
    overview = json.loads(run_cli("status", "--json", env=env).stdout)["jobs"]["flaky"]
    assert overview["last_run"]["kind"] == "worker", overview  # not "never"
    assert overview["last_run"]["id"] == worker_run and overview["running"] == []
    table = run_cli("status", env={**env, "COLUMNS": "200"})
    assert "never" not in next(line for line in table.stdout.splitlines() if "flaky" in line)

    # A second worker alive over every step (newer than the first): the run that started
    # each task is the one recorded on its row, not the newest serving at that time.
    query(
        db_url,
        "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at,"
        " heartbeat_at, ended_at, exit_code, outcome) VALUES"
        " (NULL, NULL, 'worker', 'h2', 2, 'v', 0, 4000000000000, 4000000000000, 0, 'ok')",
    )
    again = json.loads(run_cli("why", "flaky", "5", "--json", env=env).stdout)["events"]
    credited = {(e["what"], e["detail"].split(",")[0]): e["run_id"] for e in again}
    assert credited[("task succeeded", "key t1")] == worker_run, again
    assert credited[("task failed", "key t3")] == worker_run, again

    # More workers alive than a page of runs holds: the last run that is over is still
    # the second worker's (it read null once the newest 20 rows were all running).
    query(
        db_url,
        "INSERT INTO batchrun_run (job, period, kind, host, pid, version, started_at,"
        " heartbeat_at, ended_at, exit_code, outcome) VALUES "
        + ", ".join(f"(NULL, NULL, 'worker', 'live', {n}, 'v', 0, 4000000000000, NULL, NULL,"
                    " 'running')" for n in range(25)),
    )  # fmt: skip
    second = query(db_url, "SELECT id FROM batchrun_run WHERE host = 'h2'")[0][0]
    crowded = json.loads(run_cli("status", "--json", env=env).stdout)["jobs"]["flaky"]
    assert crowded["last_run"]["id"] == second and len(crowded["running"]) == 25, crowded
    with serve(env) as base:
        index = _get(f"{base}/")
    flaky_row = index.split('href="/jobs/flaky"')[1].split("</tr>")[0]
    assert f'href="/runs/{second}"' in flaky_row, flaky_row

    lines = run_cli("why", "flaky", "5", env=env)
    assert "flaky entity 5: a task unfinished, task state failed" in lines.stdout, lines.stdout
    none = json.loads(run_cli("why", "flaky", "6", "--json", env=env).stdout)
    assert (none["state"], none["eligible"]) == (None, False)
    assert [e["what"] for e in none["events"]] == ["no task"]

    with serve(env) as base:
        text, job_page, live = (
            _get(f"{base}/jobs/flaky/entities/5"),
            _get(f"{base}/jobs/flaky"),
            json.loads(_get(f"{base}/api/live")),
        )
    assert "task state" in text and "a task unfinished" in text
    assert "key t1, after 2 attempts" in text and "first attempt fails" in text
    # The job's tasks, not an empty period: 1 succeeded, 1 waiting for its retry, 1 dead.
    assert live["flaky.done"] == "2 / 4" and live["flaky.sent"] == 1, live
    assert (live["flaky.retrying"], live["flaky.failed"], live["flaky.pending"]) == (1, 1, 1)
    assert "<h2>Tasks</h2>" in job_page and "No run recorded" not in job_page
    assert ">worker<" in job_page  # the worker that ran them, though it serves every job
    assert ">events<" not in job_page  # a drain of mail events runs no task
    assert 'name="period"' not in job_page.split("<h2>Tasks</h2>")[1]  # paused as a whole


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as page:
        return html.unescape(page.read().decode())


async def test_the_task_whose_turn_it_is_is_told_however_many_wait_behind(store: Any) -> None:
    """One failed task, then more pending ones than a story tells: the failed one is still
    told, and the entity's state is its (what the rest wait behind), on each database."""
    tasks = TaskStore(store.db)
    assert await tasks.submit("steps", 9, "first", "{}")
    first = await tasks.get("steps", "first")
    assert first is not None
    now = await store.db.clock_ms()
    assert await tasks.start_many([first.id], "A", now + 10_000, now) == {first.id}
    assert await tasks.finish(first.id, "A", TaskState.FAILED, "boom", retry_at=now + 60_000)
    for n in range(MAX_TASKS):
        assert await tasks.submit("steps", 9, f"later-{n}", "{}")
    eligible, state, events = await task_events(store.db, "steps", 9, now)
    assert (eligible, state) == (True, "failed")
    assert any(e.what == "task failed" and "key first" in e.detail for e in events)
    assert events[-1].what == "older tasks", events[-1]


async def test_tasks_of_one_moment_are_told_in_their_submission_order(store: Any) -> None:
    """Rows are read newest first; tasks submitted in one millisecond (submit_many's) were
    told in reverse order, as the sort by time kept the read's."""
    tasks = TaskStore(store.db)
    for n in range(1, 6):
        assert await tasks.submit("steps", 80, f"w80-{n}", "{}")
    await store.db.execute_sql("UPDATE batchrun_entity_task SET created_at = 1000", ())
    now = await store.db.clock_ms()
    _, _, events = await task_events(store.db, "steps", 80, now)
    submitted = [e.detail for e in events if e.what == "task submitted"]
    assert submitted == [f"key w80-{n}" for n in range(1, 6)]

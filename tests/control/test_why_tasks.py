"""`batchrun why` and the dashboard for a task job: the entity's submitted tasks
(succeeded, dead, failed with its retry time), its waiting message and the worker run
that did each step; the job's tasks by state and the workers that ran them; on SQLite,
MariaDB and PostgreSQL."""

from __future__ import annotations

import html
import json
import urllib.request

from support.cli import run_cli
from support.tasks import JOBS, migrate_task_jobs
from support.ui import serve

import batchrun


def test_a_task_entitys_story(db_url: str) -> None:
    env = migrate_task_jobs(db_url)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        client.submit("flaky", 5, key="t1")  # fails once, then succeeds
        client.submit("flaky", 5, key="t2", data={"fail": "always"})  # dead
        client.submit("flaky", 5, key="t3", data={"retry_s": 9})  # failed, its retry waits
    served = run_cli("worker", "--idle-exit", "2", env=env, timeout=120)
    assert served.returncode in (0, 1), served.stderr

    told = run_cli("why", "flaky", "5", "--json", env=env)
    assert told.returncode == 0, told.stderr
    story = json.loads(told.stdout)
    assert (story["state"], story["eligible"]) == ("failed", True)  # t3: its retry waits
    steps = {(e["what"], e["detail"].split(",")[0].split(":")[0]): e for e in story["events"]}
    assert steps[("task succeeded", "key t1")]["detail"] == "key t1, after 2 attempts"
    assert "told to fail" in steps[("task dead", "key t2")]["detail"]
    failed = steps[("task failed", "key t3")]["detail"]
    assert "first attempt fails" in failed and "tried again from" in failed, failed
    waiting = [e["detail"] for e in story["events"] if e["what"] == "entity_task message waiting"]
    assert len(waiting) == 1 and "(entity_task, key t3)" in waiting[0], waiting
    assert steps[("task succeeded", "key t1")]["run_id"] is not None  # the worker's run
    assert steps[("task submitted", "key t1")]["run_id"] is None  # an application's doing
    whats = [e["what"] for e in story["events"]]
    assert "no ledger row" not in whats and "not eligible now" not in whats

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
    assert live["flaky.done"] == "2 / 3" and live["flaky.sent"] == 1, live
    assert (live["flaky.retrying"], live["flaky.failed"], live["flaky.pending"]) == (1, 1, 0)
    assert "<h2>Tasks</h2>" in job_page and "No run recorded" not in job_page
    assert ">worker<" in job_page  # the worker that ran them, though it serves every job
    assert 'name="period"' not in job_page.split("<h2>Tasks</h2>")[1]  # paused as a whole


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as page:
        return html.unescape(page.read().decode())

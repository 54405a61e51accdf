"""Tasks an application submits: each (job, key) once, one entity's tasks one at a
time and in submission order, across worker processes; the client, the CLI, status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import pytest
from support import ROOT
from support.cli import run_cli
from support.db import query
from support.tasks import (
    JOBS,
    RefusingQueue,
    StepsTask,
    effects,
    migrate_task_jobs,
    start_workers,
)

import batchrun
from batchrun.queue.base import QueueMessage
from batchrun.tasks import BadTask


def test_an_entity_task_message_round_trips_and_old_kinds_still_read() -> None:
    units = {"steps": "day", "birthday": "month"}
    message = QueueMessage("entity_task", "steps", "", entity_id=7, key="k-1")
    assert QueueMessage.from_json(message.to_json(), units) == message  # type: ignore[arg-type]
    old = '{"v":1,"kind":"retry","job":"birthday","month":"2025-06","user_id":3}'
    assert QueueMessage.from_json(old, units).entity_id == 3  # type: ignore[arg-type]


def test_each_key_runs_once_and_status_counts(db_url: str) -> None:
    env = migrate_task_jobs(db_url)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        keys = [client.submit("steps", uid, data={"seq": n}) for uid in (1, 2) for n in range(3)]
        again = client.submit_task("steps", 1, data={"seq": 9}, key=keys[0])
        assert again.key == keys[0] and not again.queued  # a key already submitted: a no-op
        with pytest.raises(BadTask, match="JSON object"):
            client.submit("steps", 1, data=[1, 2])  # type: ignore[arg-type]
        with pytest.raises(BadTask, match="unknown job"):
            client.submit("nope", 1)
    assert len(set(keys)) == 6
    before = run_cli("status", "steps", "--json", env=env)
    assert json.loads(before.stdout)["pending"] == 6, before.stderr
    served = run_cli("worker", "--idle-exit", "1", "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    done = effects(db_url)
    assert sorted(r[1] for r in done) == sorted(keys)  # each once
    status = json.loads(run_cli("status", "steps", "--json", env=env).stdout)
    assert status["succeeded"] == 6 and status["pending"] == 0 and status["dead"] == 0


def test_the_cli_submits_and_refuses_bad_input_before_queueing(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = migrate_task_jobs(sqlite_url)
    first = run_cli(
        "submit", "steps", "--id", "5", "--key", "a1", "--data", '{"x":1}', "--json", env=env
    )
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"job": "steps", "entity_id": 5, "key": "a1", "queued": True}
    again = run_cli("submit", "steps", "--id", "5", "--key", "a1", "--json", env=env)
    assert json.loads(again.stdout)["queued"] is False
    plain = run_cli("submit", "steps", "--id", "5", env=env)
    assert plain.returncode == 0 and len(plain.stdout.strip()) == 32  # a generated key
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * (201 * 1024)}))
    for args, said in (
        (["--data", "[1]"], "JSON object"),
        (["--data", "{nope"], "not JSON"),
        (["--data", f"@{big}"], "200 KB"),
    ):
        refused = run_cli("submit", "steps", "--id", "5", *args, env=env)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    unknown = run_cli("submit", "nope", "--id", "5", env=env)
    assert unknown.returncode == 2 and "unknown job" in unknown.stderr
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"name": "Jos\xe9"}')
    refused = run_cli("submit", "steps", "--id", "5", "--data", f"@{latin1}", env=env)
    assert refused.returncode == 2 and refused.stderr.strip().endswith("not UTF-8 (byte 13)")
    assert query(sqlite_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 2
    # A key may hold brackets: its "submitted before" line was read as markup (exit 1).
    for _ in range(2):
        bracket = run_cli("submit", "steps", "--id", "6", "--key", "[/x]", env=env)
        assert bracket.returncode == 0, bracket.stderr
    assert "task [/x] was submitted before: nothing queued" in bracket.stderr, bracket.stderr
    # 200 KB of UTF-8: text past Latin was measured escaped (\u00e9: 6 bytes a letter).
    accents = tmp_path / "accents.json"
    accents.write_text(json.dumps({"text": "\u00e9" * 90_000}, ensure_ascii=False), "utf-8")
    taken = run_cli("submit", "steps", "--id", "7", "--data", f"@{accents}", env=env)
    assert taken.returncode == 0, taken.stderr


def test_the_cli_reads_tasks_from_standard_input_and_names_a_bad_line(sqlite_url: str) -> None:
    env = migrate_task_jobs(sqlite_url)
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env

    def submit(text: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "batchrun", "submit", "steps", *args],
            input=text, env=full, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    for text, args, said in (
        ('{"entity_id": 1}\n[1]\n', ["--file", "-"], "--file - line 2: not a JSON object"),
        (
            '{"entity_id": 1}\n{"entity_id": "2"}\n',
            ["--file", "-"],
            'line 2: entity_id is not an integer: "2"',
        ),
        ('{"entity_id": true}\n', ["--file", "-"], "line 1: entity_id is not an integer: true"),
        ('{"entity_id": 1, "entity_id": 2}\n', ["--file", "-"], "field 'entity_id' is given twice"),
        (
            '{"entity_id": 1, "key": "a"}\r\n{"entity_id": 2, "key": "a"}\n',
            ["--file", "-"],
            "line 2: key 'a' is on line 1 already",
        ),
        (
            '{"entity_id": 1, "data": {"t": "\u2028"}}\n{"entity_id": 2, "dta": 1}\n',
            ["--file", "-"],
            "line 2: unknown field 'dta'",
        ),
        ('{"key": "k"}\n', ["--file", "-"], "line 1: no entity_id"),
        ('{"entity_id": 1, "data": [1]}\n', ["--file", "-"], "line 1: task data must be"),
        ("{nope\n", ["--file", "-"], "line 1: not JSON"),
        ("", ["--file", "-", "--id", "3"], "leave out --id, --key and --data"),
        ("", ["--id", "3", "--id", "4", "--key", "k"], "--key names one task"),
        ("", [], "give --id, or --file"),
    ):
        refused = submit(text, *args)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
        assert len(refused.stderr.splitlines()) == 1 and refused.stdout == ""
    assert query(sqlite_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 0
    done = submit('{"entity_id": 1, "key": "s1"}\n{"entity_id": 2}\n', "--file", "-", "--json")
    assert done.returncode == 0, done.stderr
    said = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(s["entity_id"], s["queued"]) for s in said] == [(1, True), (2, True)]
    assert (
        said[0]["key"] == "s1"
        and query(sqlite_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 2
    )
    empty = submit("\n", "--file", "-")
    assert empty.returncode == 0 and empty.stdout == "", empty.stderr
    assert "no tasks given: nothing queued" in empty.stderr
    # s1 went for entity 1: a file that gives it for entity 3 is told on which line.
    clash = submit('{"entity_id": 4}\n\n{"entity_id": 3, "key": "s1"}\n', "--file", "-")
    assert clash.returncode == 2 and clash.stdout == "", clash.stderr
    assert "--file - line 3: task key 's1' was submitted for entity 1" in clash.stderr
    assert query(sqlite_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 2


def test_a_reader_that_goes_away_does_not_stop_a_submission(sqlite_url: str) -> None:
    """stdout closed before the first key is printed (``| head -1`` gone): all 40 tasks
    are queued all the same, and the command ends as usual."""
    env = migrate_task_jobs(sqlite_url)
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    text = "".join(json.dumps({"entity_id": n % 5 + 1}) + "\n" for n in range(40))
    read, write = os.pipe()
    os.close(read)  # nobody reads: the first print is a broken pipe
    try:
        done = subprocess.run(
            [sys.executable, "-m", "batchrun", "submit", "steps", "--file", "-"],
            input=text.encode(), env=full, cwd=ROOT, stdout=write, stderr=subprocess.PIPE,
            timeout=60,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert query(sqlite_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0] == 40


def test_after_a_queue_error_stdout_names_what_stays_queued(sqlite_url: str) -> None:
    """The table queue refuses its second call (a trigger, from outside): the first ten
    tasks stay queued and are on stdout, the rest taken back; the same file again queues
    those and is a no-op for the ten."""
    env = migrate_task_jobs(sqlite_url)
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    text = "".join(json.dumps({"entity_id": n % 4 + 1, "key": f"q{n}"}) + "\n" for n in range(25))
    query(
        sqlite_url,
        "CREATE TRIGGER full_queue BEFORE INSERT ON batchrun_queue"
        " WHEN (SELECT COUNT(*) FROM batchrun_queue) >= 10"
        " BEGIN SELECT RAISE(ABORT, 'the queue is full'); END",
    )

    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "batchrun", "submit", "steps", "--file", "-", *args],
            input=text, env=full, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    failed = submit()
    assert failed.returncode != 0 and "the queue is full" in failed.stderr, failed.stderr
    queued = [json.loads(r[0])["key"] for r in query(sqlite_url, "SELECT body FROM batchrun_queue")]
    assert (
        failed.stdout.split()
        == sorted(queued, key=lambda k: int(k[1:]))
        == [f"q{n}" for n in range(10)]
    )
    tasks = query(sqlite_url, "SELECT task_key FROM batchrun_entity_task")
    assert sorted(r[0] for r in tasks) == sorted(queued)  # the rest taken back
    query(sqlite_url, "DROP TRIGGER full_queue")
    again = submit("--json")
    said = [json.loads(line) for line in again.stdout.splitlines()]
    assert [s["queued"] for s in said] == [False] * 10 + [True] * 15, again.stderr


def test_a_retried_task_keeps_its_place_and_a_failed_one_is_dead(sqlite_url: str) -> None:
    env = migrate_task_jobs(sqlite_url)
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        client.submit("flaky", 1, key="r1")
        client.submit("flaky", 1, key="f1", data={"fail": "always"})
    served = run_cli("worker", "--idle-exit", "2", "--json", env=env, timeout=120)
    assert served.returncode in (0, 1), served.stderr
    assert [r[1] for r in effects(sqlite_url)] == ["r1", "r1"]  # a retry, then success
    status = json.loads(run_cli("status", "flaky", "--json", env=env).stdout)
    assert (status["succeeded"], status["dead"], status["pending"]) == (1, 1, 0)
    # Its cause fixed, its dead letter redriven: it runs again. The worker found the task
    # dead and dropped the message unworked (the dead letter gone, the task never run).
    query(sqlite_url, "UPDATE batchrun_entity_task SET data = '{}' WHERE task_key = 'f1'")
    [letter] = json.loads(run_cli("dead", "list", "--json", env=env).stdout)
    assert run_cli("dead", "redrive", "--id", letter["id"], env=env).returncode == 0
    served = run_cli("worker", "--idle-exit", "2", "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    assert [r[1] for r in effects(sqlite_url)] == ["r1", "r1", "f1", "f1"]
    status = json.loads(run_cli("status", "flaky", "--json", env=env).stdout)
    assert (status["succeeded"], status["dead"], status["pending"]) == (2, 0, 0)


def test_a_paused_task_job_waits_then_runs(sqlite_url: str) -> None:
    env = {
        **migrate_task_jobs(sqlite_url),
        "BATCHRUN_LEASE_S": "2",
    }  # a paused task looks again in 2 s
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        client.submit("steps", 1, key="p1")
    assert run_cli("pause", "steps", "--reason", "encoder upgrade", env=env).returncode == 0
    held = json.loads(run_cli("status", "steps", "--json", env=env).stdout)
    assert (held["paused"], held["paused_reason"]) == (True, "encoder upgrade")
    # Paused work is none this worker can do: --idle-exit ends it (it waited for good),
    # an idle time longer than the lease too (the task comes back every lease, unworked).
    for idle in ("1", "5"):
        assert run_cli("worker", "--idle-exit", idle, env=env, timeout=60).returncode == 0
    assert effects(sqlite_url) == []  # paused: nothing ran, the task waits
    assert run_cli("resume", "steps", env=env).returncode == 0
    assert "paused" not in json.loads(run_cli("status", "steps", "--json", env=env).stdout)
    assert run_cli("worker", "--idle-exit", "5", env=env, timeout=120).returncode == 0
    assert [r[1] for r in effects(sqlite_url)] == ["p1"]


def _started_keys(url: str) -> list[str]:
    return [str(r[1]) for r in sorted(effects(url), key=lambda r: r[3])]


def _wait_for_effects(url: str, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(effects(url)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} tasks ran"
        time.sleep(0.1)


def test_a_cancel_stops_a_worker_working_the_task_job(sqlite_url: str) -> None:
    """`cancel steps` said "1 run going on" and stopped nothing: the batch's claims named
    no job a cancel could match, and the worker ran every task it had taken."""
    env = {**migrate_task_jobs(sqlite_url), "BATCHRUN_LEASE_S": "1.5"}
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        for n in range(6):
            client.submit("steps", 1, data={"seq": n, "sleep": 3.0}, key=f"c{n}")
    worker = start_workers({**env}, 1, "--prefetch", "10", "--concurrency", "1", "--json")[0]
    _wait_for_effects(sqlite_url, 1)
    cancel = run_cli("cancel", "steps", env=env)
    assert "(1 run going on)" in cancel.stderr, cancel.stderr
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 130, err
    assert json.loads(out)["stopped"] == "cancelled"
    ran = len(effects(sqlite_url))
    assert ran <= 3, f"{ran} of 6 ran: the cancel stopped none"  # in flight, one heartbeat
    assert _runs_outcome(env) == "cancelled"
    # A later worker is not affected: it does the rest, in order.
    assert run_cli("worker", "--idle-exit", "3", env=env, timeout=120).returncode == 0
    assert _started_keys(sqlite_url) == [f"c{n}" for n in range(6)]


def test_a_cancel_given_before_a_worker_works_the_job_stops_nothing_later(
    sqlite_url: str,
) -> None:
    """A cancel stops the work going on when it is given, not later work: a worker that
    took the job's first message after the cancel worked it, then exited 130 as cancelled."""
    env = {**migrate_task_jobs(sqlite_url), "BATCHRUN_LEASE_S": "1.5"}
    worker = start_workers(env, 1, "--idle-exit", "120", "--json")[0]  # the last one holds
    deadline = time.monotonic() + 30
    while _runs_outcome(env, default="") != "running":
        assert time.monotonic() < deadline and worker.poll() is None, "the worker never started"
        time.sleep(0.2)
    assert "(1 run going on)" in run_cli("cancel", "steps", env=env).stderr
    time.sleep(1.0)  # the worker's heartbeat reads the cancel: nothing of steps going on
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        client.submit("steps", 1, key="later")
    _wait_for_effects(sqlite_url, 1)
    time.sleep(1.0)  # heartbeats after the task: a cancel that counted would stop it now
    assert worker.poll() is None, "the worker stopped"
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert json.loads(out)["stopped"] == "received SIGTERM", out
    assert [r[1] for r in effects(sqlite_url)] == ["later"]


def test_a_pause_holds_a_batch_of_tasks_that_take_no_turn(sqlite_url: str) -> None:
    """A task job with ``serial = "none"`` holds no turn, and its batch's claims named no
    job a pause could hold: every task a worker had taken (its --prefetch) started."""
    env = {**migrate_task_jobs(sqlite_url), "BATCHRUN_LEASE_S": "1.5"}
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        for n in range(6):
            client.submit("loose", n + 1, data={"sleep": 3.0}, key=f"l{n}")
    worker = start_workers({**env}, 1, "--prefetch", "10", "--concurrency", "1")[0]
    _wait_for_effects(sqlite_url, 1)
    assert run_cli("pause", "loose", env=env).returncode == 0
    time.sleep(10.0)  # a heartbeat, the task in flight, and three more had it not held
    held = len(effects(sqlite_url))
    assert held <= 3, f"{held} of 6 ran while paused"
    assert run_cli("resume", "loose", env=env).returncode == 0
    worker.communicate(timeout=60)
    assert worker.returncode == 0
    assert len(effects(sqlite_url)) == 6


def test_a_worker_with_a_bad_backend_setting_takes_no_message(sqlite_url: str) -> None:
    """A backend's setting was read when a task first used it, after its message was
    taken: each start of a worker so set up took the message, exited 2, and counted a
    receive, which on SQS dead-letters the task untried. It is checked first now."""
    env = migrate_task_jobs(sqlite_url)
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        client.submit("slotted", 1, key="s1")
    bad = {**env, "BATCHRUN_BACKEND_SLOT_URL": "ftp://x"}
    for command in (("worker", "--idle-exit", "1"), ("retry",)):
        refused = run_cli(*command, env=bad, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert "BATCHRUN_BACKEND_SLOT_URL must be an http(s):// URL" in refused.stderr
    assert query(sqlite_url, "SELECT receive_count FROM batchrun_queue") == [(0,)]
    assert run_cli("worker", "--idle-exit", "1", env=env, timeout=60).returncode == 0
    assert [r[1] for r in effects(sqlite_url)] == ["s1"]


def test_tasks_of_two_jobs_in_one_batch_run_side_by_side(sqlite_url: str) -> None:
    """A batch ran one job's tasks after the other's: a task of another entity (and job)
    waited for a slow one, though --concurrency allowed both."""
    env = migrate_task_jobs(sqlite_url)
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        client.submit("steps", 1, data={"sleep": 2.0}, key="slow")
        client.submit("loose", 2, key="quick")
    served = run_cli(
        "worker", "--prefetch", "10", "--concurrency", "4", "--idle-exit", "1", env=env
    )
    assert served.returncode == 0, served.stderr
    rows = {str(r[1]): r for r in effects(sqlite_url)}
    assert set(rows) == {"slow", "quick"}
    assert rows["quick"][3] < rows["slow"][4], "the quick task waited for the slow one"


def test_the_lambda_works_a_job_beside_another_job_s_bad_backend_setting(
    sqlite_url: str,
) -> None:
    """The check of every job's named-backend settings belongs to `retry` and `worker`
    (before they take a message): in the Lambda's batch it failed every job's messages,
    over and over until the queue dead-lettered them, for one job's bad setting."""
    from support.lambda_context import FakeContext, as_sqs_event

    from batchrun import aws_lambda

    env = migrate_task_jobs(sqlite_url)
    with batchrun.connect(db=sqlite_url, jobs=JOBS, env={}) as client:
        client.submit("steps", 1, key="t1")
    [(body,)] = query(sqlite_url, "SELECT body FROM batchrun_queue")
    query(sqlite_url, "DELETE FROM batchrun_queue")  # the event carries it instead
    event = as_sqs_event([{"MessageId": "m1", "ReceiptHandle": "r1", "Body": body}])
    bad = {**env, "BATCHRUN_BACKEND_SLOT_URL": "ftp://x"}  # slotted's backend, not steps'
    result = aws_lambda.handle(event, FakeContext(60), environ=bad)
    assert result == {"batchItemFailures": []}, result
    assert [r[1] for r in effects(sqlite_url)] == ["t1"]


def _runs_outcome(env: dict[str, str], default: str | None = None) -> str:
    rows = json.loads(run_cli("runs", "--json", "--limit", "1", env=env).stdout)
    if not rows and default is not None:
        return default
    return str(rows[0]["outcome"])


def test_a_task_jobs_period_cannot_be_steered_or_read(sqlite_url: str) -> None:
    """A task job is paused as a whole: a period's pause or cancel would reach none of its
    tasks, so it is refused (exit 2, one line) and nothing is written."""
    env = migrate_task_jobs(sqlite_url)
    for verb in ("pause", "cancel"):
        refused = run_cli(verb, "steps", "--period", "2026-12-02", env=env)
        assert refused.returncode == 2, (verb, refused.stderr)
        assert "task job, which has no periods" in refused.stderr, refused.stderr
    # Nor is a period read from: status and why would ignore it, so they refuse it too.
    for args in (
        ("status", "steps", "--period", "2026-12-02"),
        ("why", "steps", "1", "--period", "2026-12-02"),
        ("status", "steps", "--month", "2026-12"),
    ):
        refused = run_cli(*args, env=env)
        assert refused.returncode == 2, (args, refused.stderr)
        assert "steps is a task job, which has no periods: leave out --" in refused.stderr
    assert run_cli("why", "steps", "1", env=env).returncode == 0
    # Nor run as a period's job: it said "eligible 0", exit 0, as if that were the answer.
    for args in (("run", "steps"), ("preview", "steps", "--id", "7")):
        refused = run_cli(*args, env=env)
        assert refused.returncode == 2, (args, refused.stderr)
        assert (
            "steps is a task job: `" in refused.stderr and "batchrun submit steps" in refused.stderr
        )
    assert query(sqlite_url, "SELECT COUNT(*) FROM batchrun_control")[0][0] == 0
    # A period's pause written before this was refused can still be cleared.
    query(
        sqlite_url,
        "INSERT INTO batchrun_control (job, period, paused, reason, paused_at, updated_at)"
        " VALUES ('steps', '2026-12-02', 1, 'old', 0, 0)",
    )
    cleared = run_cli("resume", "steps", "--period", "2026-12-02", env=env)
    assert cleared.returncode == 0, cleared.stderr
    rows = query(sqlite_url, "SELECT COUNT(*) FROM batchrun_control WHERE paused = 1")
    assert rows[0][0] == 0


@pytest.mark.parametrize("server", ["mysql", "postgresql"])
def test_four_workers_200_users_3_tasks_each(server: str, request: pytest.FixtureRequest) -> None:
    db_url: str = request.getfixturevalue(f"{server}_url" if server == "mysql" else "postgres_url")
    env = migrate_task_jobs(db_url)
    submitted: dict[int, list[str]] = defaultdict(list)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        for seq in range(3):
            for uid in range(1, 201):
                submitted[uid].append(client.submit("steps", uid, data={"seq": seq, "sleep": 0.01}))
    workers = start_workers(env, 4)
    for worker in workers:
        _, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-2000:]
    rows = effects(db_url)
    assert len(rows) == 600 and len({r[1] for r in rows}) == 600  # every task exactly once
    ledger = query(db_url, "SELECT COUNT(*) FROM batchrun_entity_task WHERE state = 2")
    assert ledger[0][0] == 600  # the task table agrees with the effect log
    per_user: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in rows:
        per_user[int(row[0])].append(row)
    overlaps = 0
    for uid, runs in per_user.items():
        runs.sort(key=lambda r: r[3])
        overlaps += sum(1 for a, b in pairwise(runs) if b[3] < a[4])
        assert [r[1] for r in runs] == submitted[uid], f"user {uid} out of submission order"
    assert overlaps == 0


async def test_a_batch_claims_with_the_one_task_conditions(store: Any) -> None:
    """The set-wise statements a batch claims with (pipeline/task_claim.py): a live turn or
    task lease is nobody else's, an expired one is taken over, only the oldest unfinished
    task of an entity is its turn, and an end is recorded only under the lease."""
    import asyncio

    from batchrun.db.store import now_ms
    from batchrun.tasks.store import TaskState, TaskStore

    tasks = TaskStore(store.db)
    for entity, key in ((1, "a1"), (1, "a2"), (2, "b1")):
        assert await tasks.submit("steps", entity, key, "{}")
    rows = await tasks.get_many("steps", ["a1", "a2", "b1", "nope"])
    assert sorted(rows) == ["a1", "a2", "b1"] and rows["a2"].entity_id == 1
    a1, b1 = rows["a1"].id, rows["b1"].id
    now = now_ms()
    assert await tasks.take_turns("steps", [1, 2], "A", now + 10_000, now) == {1, 2}
    assert await tasks.take_turns("steps", [1, 2], "B", now + 10_000, now) == set()  # live
    assert await tasks.first_unfinished_ids("steps", [1, 2]) == {1: a1, 2: b1}
    assert await tasks.start_many([a1, b1], "A", now + 10_000, now) == {a1, b1}
    assert await tasks.start_many([a1, b1], "B", now + 10_000, now) == set()  # A's leases live
    later = now + 20_000  # A's leases have ended: B takes b1 over
    assert await tasks.start_many([b1], "B", later + 10_000, later) == {b1}
    assert await tasks.finish_many([a1, b1], "A", TaskState.SUCCEEDED) == {a1}  # b1 is B's
    assert await tasks.finish_many([b1], "B", TaskState.SUCCEEDED) == {b1}
    await asyncio.sleep(0.01)  # a later millisecond: an end of its own (see finish_many)
    assert await tasks.finish_many([a1], "A", TaskState.SUCCEEDED) == set()  # ended already
    assert await tasks.first_unfinished_ids("steps", [1, 2]) == {1: rows["a2"].id}
    for key in ("a1", "b1"):
        row = await tasks.get("steps", key)
        assert row is not None and (row.state, row.attempts) == (TaskState.SUCCEEDED, 1)
    await tasks.release_turns("steps", [1, 2], "B")  # not B's: nothing changes
    assert await tasks.take_turns("steps", [1], "B", now + 10_000, now) == set()
    await tasks.release_turns("steps", [1, 2], "A")
    assert await tasks.take_turns("steps", [1, 2], "B", now + 10_000, now) == {1, 2}


async def test_a_submission_whose_send_fails_is_withdrawn_unless_started(store: Any) -> None:
    """``submit`` takes its row back when the queue refuses the message, on each database;
    the withdrawal touches only a submission no process has started."""
    from batchrun.errors import QueueError
    from batchrun.queue.base import WorkQueue
    from batchrun.tasks.store import TaskStore
    from batchrun.tasks.submit import submit

    tasks = TaskStore(store.db)
    with pytest.raises(QueueError):
        await submit(
            store.db,
            cast(WorkQueue, RefusingQueue()),
            StepsTask(),
            5,
            {"n": 1},
            "k1",
            resend_after_s=300,
        )
    assert await tasks.get("steps", "k1") is None  # taken back: "k1" can be submitted again
    assert await tasks.submit("steps", 5, "k1", "{}")
    row = await tasks.get("steps", "k1")
    assert row is not None and await tasks.start(row.id, "A", 30.0)
    assert not await tasks.withdraw("steps", ["k1"])  # started: never taken back
    assert await tasks.get("steps", "k1") is not None


async def test_status_tells_a_dead_process_s_task_from_a_running_one(store: Any) -> None:
    """A worker killed mid-task left its task counted `running` until it ran again (up to
    its message's visibility later); a period's status says claimed_by_stopped_run."""
    import asyncio

    from batchrun.tasks.store import TaskStore

    tasks = TaskStore(store.db)
    for entity, key in ((1, "alive"), (2, "orphan")):
        assert await tasks.submit("steps", entity, key, "{}")
    rows = await tasks.get_many("steps", ["alive", "orphan"])
    assert await tasks.start(rows["alive"].id, "A", 60.0)
    assert await tasks.start(rows["orphan"].id, "B", 0.05)  # B dies: its lease passes
    await asyncio.sleep(0.2)
    counts = await tasks.counts("steps")
    assert (counts["running"], counts["claimed_by_stopped_run"], counts["pending"]) == (1, 1, 0)

"""The guarantees, once, for every job: birthday and both example jobs, SQLite and MariaDB.

Each test is parametrised over (job case x database): a ``JobCase`` (tests/support/job_cases.py)
seeds the job's own schema, runs it, fails its effect on demand and counts its effects per
entity, so a guarantee is written once and holds for any job written on ``batchrun.Job``.

batchrun runs as ``python -m batchrun`` subprocesses, as in production (SIGKILL and exit
codes are the real ones), except the Lambda handler, which is called in-process with a
fake context whose deadline is real time. Queues are batchrun's default, the table in the
job's database. Random moments come from ``random.Random`` seeded by the test's name and
``BATCHRUN_TEST_SEED``, and every assertion names them, so a failure reproduces.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Set as AbstractSet
from typing import Any

import pytest
from support import ROOT
from support.cli import summary_of, wait_until
from support.db import query, table_digest
from support.http_server import GrantsTestServer
from support.job_cases import CASES, JobCase
from support.lambda_context import FakeContext
from support.smtp_server import SmtpTestServer

from batchrun import aws_lambda
from batchrun.db.store import now_ms

SEED = int(os.environ.get("BATCHRUN_TEST_SEED", "20250607"))
ENTITIES = 150  # about this many per period: enough to land a kill or a deadline mid-run
CONCURRENCY = 5  # the in-flight limit: the duplicate bound after a crash
STATES = {"succeeded": 1, "skipped": 2, "retrying": 3, "failed": 4}


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(params=list(CASES))
def case(
    request: pytest.FixtureRequest,
    smtp_server: SmtpTestServer,
    grants_server_session: GrantsTestServer,
) -> JobCase:
    """One job, bound to this test's (reset) SMTP and grants servers."""
    grants_server_session.reset()
    return CASES[request.param](smtp_server, grants_server_session)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return random.Random(f"{SEED}:{request.node.name}")


def spawn(
    case: JobCase, db_url: str, *args: str, stdout: Any = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """Start ``python -m batchrun [--jobs SPEC] ARGS`` without waiting for it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    return subprocess.Popen(
        [sys.executable, "-m", "batchrun", *case.args(*args)],
        env=env | case.env(db_url),
        cwd=ROOT,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(case: JobCase, db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``run JOB --period P --concurrency C --json ARGS``."""
    return case.cli(
        db_url,
        "run",
        case.name,
        "--period",
        case.period,
        "--concurrency",
        str(CONCURRENCY),
        "--json",
        *args,
    )


def status_of(case: JobCase, db_url: str) -> dict[str, Any]:
    result = case.cli(db_url, "status", case.name, "--period", case.period, "--all", "--json")
    assert result.returncode == 0, result.stderr
    return summary_of(result)


def queue_rows(db_url: str) -> list[tuple[Any, ...]]:
    """(receive_count, visible_at) of every live message of the local queue."""
    return query(db_url, "SELECT receive_count, visible_at FROM batchrun_queue WHERE dead = 0")


def problems(status: dict[str, Any], state: str) -> set[int]:
    return {int(p["id"]) for p in status["problems"] if p["state"] == state}


def expected_states(case: JobCase, failed: AbstractSet[int] = frozenset()) -> dict[int, int]:
    """entity id -> the ledger state it must end in."""
    ents = case.entities
    return (
        dict.fromkeys(ents.want - failed, STATES["succeeded"])
        | dict.fromkeys(failed, STATES["failed"])
        | dict.fromkeys(ents.skip, STATES["skipped"])
    )


def complete(case: JobCase, db_url: str) -> bool:
    """Whether every selected entity has its final state and no claim is left."""
    ledger = case.ledger(db_url)
    states = {uid: state for uid, (state, _) in ledger.items()}
    return states == expected_states(case) and all(o is None for _, o in ledger.values())


def assert_done_once(
    case: JobCase,
    db_url: str,
    *,
    where: str,
    failed: AbstractSet[int] = frozenset(),
    max_duplicates: int = 0,
) -> int:
    """Every entity ended once, in the ledger and in its effects; the duplicates seen."""
    ledger = case.ledger(db_url)
    states = {uid: state for uid, (state, _) in ledger.items()}
    expected = expected_states(case, failed)
    wrong = {u: (states.get(u), s) for u, s in expected.items() if states.get(u) != s}
    extra = set(states) - set(expected)
    assert not wrong and not extra, (
        f"{case} ({where}): ledger (got, want) {dict(list(wrong.items())[:10])}, "
        f"{len(wrong)} wrong; rows for unselected entities {sorted(extra)[:10]}"
    )
    held = sorted(uid for uid, (_, owner) in ledger.items() if owner is not None)
    assert not held, f"{case} ({where}): claims left behind: {held[:10]}"
    done = case.entities.want - failed
    effects = case.effects()
    assert set(effects) == done, (
        f"{case} ({where}): every entity's effect, and no other: "
        f"missing {sorted(done - set(effects))[:10]}, extra {sorted(set(effects) - done)[:10]}"
    )
    duplicates = sum(n - 1 for n in effects.values())
    assert duplicates <= max_duplicates, (
        f"{case} ({where}): {duplicates} duplicate effects > {max_duplicates}: "
        f"{sorted(u for u, n in effects.items() if n > 1)[:10]}"
    )
    case.check_records(db_url, done, failed)
    return duplicates


# -- 1. crash anywhere, then a rerun -------------------------------------------------------


def test_a_kill_anywhere_then_a_rerun_completes_the_period_once(
    case: JobCase, db_url: str, rng: random.Random
) -> None:
    ents = case.seed(db_url, ENTITIES, seed=rng.randrange(1000))
    case.slow_down(0.02)  # ~0.6 s of effects after ~0.4 s of start-up
    victim = spawn(
        case, db_url, "run", case.name, "--period", case.period,
        "--concurrency", str(CONCURRENCY),
    )  # fmt: skip
    if rng.random() < 0.5:
        # Anywhere: start-up, the schema check, the first claims, prepare, the first effects.
        delay = rng.uniform(0.0, 0.8)
        moment = f"{delay:.3f} s after start"
        wait_until(lambda: victim.poll() is not None, timeout=delay)
    else:
        target = rng.randint(1, int(len(ents.want) * 0.8))
        moment = f"after {target} effects"
        wait_until(lambda: case.effect_count() >= target or victim.poll() is not None, timeout=30)
    victim.kill()  # SIGKILL: claims, half-made effects and unrecorded outcomes left behind
    _, err = victim.communicate(timeout=10)
    where = f"killed {moment}, seed {SEED}"
    assert victim.returncode == -9, f"{case}: the run ended before the kill ({where}): {err}"
    done_before = sum(1 for state, _ in case.ledger(db_url).values() if state == 1)

    case.slow_down(0)
    rerun = run(case, db_url)
    assert rerun.returncode == 0, f"{where}: {rerun.stderr}"
    # The rerun did what the killed run had not recorded, and nothing it had.
    assert summary_of(rerun)["succeeded"] == len(ents.want) - done_before, where
    duplicates = assert_done_once(case, db_url, where=where, max_duplicates=CONCURRENCY)
    print(f"{case}: killed {moment}, {done_before} done before, {duplicates} duplicates")


# -- 2. two runs at once -------------------------------------------------------------------


def test_two_runs_at_once_partition_the_period(case: JobCase, db_url: str) -> None:
    ents = case.seed(db_url, ENTITIES)
    case.slow_down(0.01)  # long enough that the runs overlap
    args = ("run", case.name, "--period", case.period, "--concurrency", str(CONCURRENCY))
    runs = [
        spawn(case, db_url, *args, "--page-size", "10", "--json", stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    summaries = []
    for process in runs:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        summaries.append(json.loads(out))
    a, b = summaries
    assert a["succeeded"] + b["succeeded"] == len(ents.want), (a, b)
    assert a["skipped"] + b["skipped"] == len(ents.skip), (a, b)
    # Each run counts what it claimed. With a 1 s lease a heartbeat late on a loaded machine
    # lets the other run take over claims not worked yet: both counted them, and the one
    # that lost them says so in lost_claims (its fence kept it from working them).
    taken_over = a["lost_claims"] + b["lost_claims"]
    selected = a["eligible"] + b["eligible"]
    assert len(ents.selected) <= selected <= len(ents.selected) + taken_over, (a, b)
    assert a["succeeded"] > 0 and b["succeeded"] > 0, f"both runs should have worked: {a} {b}"
    assert_done_once(case, db_url, where="two runs at once")


# -- 3. temporary failures, then retry -------------------------------------------------------


def test_temporary_failures_exit_3_and_retry_completes_the_period(
    case: JobCase, db_url: str, rng: random.Random
) -> None:
    ents = case.seed(db_url, ENTITIES)
    case.inject("temporary", rng)
    first = run(case, db_url)
    assert first.returncode == 3, first.stderr
    failing = case.failed("temporary")
    assert failing, "the injected failure should have hit someone"
    summary = summary_of(first)
    assert summary["failed"] == summary["queued_for_retry"] == len(failing), summary
    assert summary["succeeded"] == len(ents.want) - len(failing), summary
    # Nothing lost: each failure waits in the ledger and has its one retry message.
    retrying = {u for u, (state, _) in case.ledger(db_url).items() if state == STATES["retrying"]}
    assert retrying == failing
    assert len(queue_rows(db_url)) == len(failing)

    case.recover()
    retry = case.cli(db_url, "retry", "--concurrency", str(CONCURRENCY), "--json")
    assert retry.returncode == 0, retry.stderr
    drained = summary_of(retry)
    assert drained["succeeded"] == len(failing), drained
    assert drained["failed"] == drained["remaining"] == 0, drained
    assert_done_once(case, db_url, where="after retry")


# -- 4. permanent failures -------------------------------------------------------------------


def test_permanent_failures_are_dead_lettered_listed_and_never_retried(
    case: JobCase, db_url: str, rng: random.Random
) -> None:
    ents = case.seed(db_url, ENTITIES)
    case.inject("permanent", rng)
    first = run(case, db_url)
    assert first.returncode == 0, first.stderr  # nothing waits for a retry
    failing = case.failed("permanent")
    assert failing, "the injected failure should have hit someone"
    summary = summary_of(first)
    assert summary["failed"] == summary["dead_lettered"] == len(failing), summary
    assert summary["queued_for_retry"] == 0, summary
    assert summary["succeeded"] == len(ents.want) - len(failing), summary
    status = status_of(case, db_url)
    assert status["failed_permanent"] == status["dead_letter_depth"] == len(failing), status
    assert status["retrying"] == status["retry_queue_depth"] == 0, "nothing is retried"
    assert problems(status, "failed") == failing
    reasons = [p["reason"] for p in status["problems"] if p["state"] == "failed"]
    assert all(case.reasons["permanent"] in str(r) for r in reasons), reasons
    assert problems(status, "skipped") == ents.skip

    assert_done_once(case, db_url, where="permanent failures", failed=failing)


# -- 5. dry run ------------------------------------------------------------------------------


def test_dry_run_touches_nothing(case: JobCase, db_url: str) -> None:
    ents = case.seed(db_url, ENTITIES)
    history = run(case, db_url, "--limit", "20")  # ledger rows, effects: a period under way
    assert history.returncode == 0, history.stderr
    before = table_digest(db_url)
    effects = case.effect_count()
    dry = run(case, db_url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    summary = summary_of(dry)
    assert summary["dry_run"] is True
    assert summary["eligible"] == len(ents.selected) - 20, summary
    assert (summary["succeeded"], summary["emails_sent"], summary["failed"]) == (0, 0, 0)
    assert table_digest(db_url) == before, "a dry run wrote to the database"
    assert case.effect_count() == effects, "a dry run sent something"


# -- 6. fan-out with a killed worker ---------------------------------------------------------


def test_fan_out_with_a_worker_killed_mid_shard_completes_the_period(
    case: JobCase, db_url: str, rng: random.Random
) -> None:
    ents = case.seed(db_url, ENTITIES)
    produced = case.cli(
        db_url, "run", case.name, "--period", case.period,
        "--fan-out", "local", "--shard-size", "40", "--json",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    shards = summary_of(produced)
    assert shards["users"] == len(ents.selected)
    assert shards["shards"] == -(-len(ents.selected) // 40)
    assert case.effect_count() == 0, "the producer only queues"

    case.slow_down(0.02)
    worker = ("worker", "--concurrency", str(CONCURRENCY), "--visibility", "1", "--json")
    victim = spawn(case, db_url, *worker)
    target = rng.randint(1, int(len(ents.want) * 0.6))
    wait_until(lambda: case.effect_count() >= target or victim.poll() is not None, timeout=30)

    def mid_shard() -> bool:  # the victim holds a shard message it has not finished
        return any(count > 0 and visible > now_ms() for count, visible in queue_rows(db_url))

    assert wait_until(mid_shard, timeout=2), "the victim should be working a shard"
    victim.kill()  # its claims expire after the lease, its shard message reappears
    _, err = victim.communicate(timeout=10)
    assert victim.returncode == -9, err
    where = f"worker killed after {target} effects, seed {SEED}"

    case.slow_down(0)
    survivor = spawn(case, db_url, *worker, stdout=subprocess.PIPE)
    try:
        finished = wait_until(
            lambda: not queue_rows(db_url) and complete(case, db_url), timeout=30, step=0.1
        )
    finally:
        survivor.terminate()  # SIGTERM: a worker stops between messages
        out, err = survivor.communicate(timeout=30)
    assert finished, f"{where}: the survivor did not finish the period: {err[-2000:]}"
    assert survivor.returncode == 0, err
    assert json.loads(out)["succeeded"] > 0
    assert_done_once(case, db_url, where=where, max_duplicates=CONCURRENCY)


# -- 7. the Lambda's deadline hand-off -------------------------------------------------------


def drain_as_sqs_events(
    db_url: str, environ: dict[str, str], seconds: float
) -> list[dict[str, Any]]:
    """Feed the local queue to the handler as an SQS event source mapping would."""
    results: list[dict[str, Any]] = []
    for _ in range(20):
        now = now_ms()
        got = query(
            db_url,
            "SELECT id, body, receive_count FROM batchrun_queue "
            "WHERE dead = 0 AND visible_at <= %s ORDER BY id LIMIT 10",
            now,
        )
        if not got:
            if not queue_rows(db_url):
                return results
            time.sleep(0.1)
            continue
        ids = [int(r[0]) for r in got]
        marks = ", ".join(["%s"] * len(ids))
        query(
            db_url,
            "UPDATE batchrun_queue SET visible_at = %s, receive_count = receive_count + 1 "
            f"WHERE id IN ({marks})",
            now + 60_000,
            *ids,
        )
        event = {
            "Records": [
                {
                    "messageId": str(uid),
                    "receiptHandle": f"r{uid}",
                    "body": body,
                    "attributes": {"ApproximateReceiveCount": str(int(count) + 1)},
                    "eventSource": "aws:sqs",
                }
                for uid, body, count in got
            ]
        }
        context = FakeContext(seconds, "req-guarantees")
        result = aws_lambda.handle(event, context, environ=environ)
        assert context.get_remaining_time_in_millis() > 0, "returned after its deadline"
        results.append(result)
        failed = {int(f["itemIdentifier"]) for f in result["batchItemFailures"]}
        done = [uid for uid in ids if uid not in failed]  # what the mapping deletes
        if done:
            marks = ", ".join(["%s"] * len(done))
            query(db_url, f"DELETE FROM batchrun_queue WHERE id IN ({marks})", *done)
    raise AssertionError("the queue never drained")


def test_the_lambda_hands_off_before_its_deadline_and_loses_nothing(
    case: JobCase, db_url: str
) -> None:
    ents = case.seed(db_url, ENTITIES)
    case.slow_down(0.04)  # ~1.2 s of effects at concurrency 5: more than one invocation
    # In-flight effects get 70% of the margin to finish: 20x an effect's time, room for a
    # loaded machine (an effect cut off after it took place would be done twice).
    environ = case.env(
        db_url, BATCHRUN_CONCURRENCY=str(CONCURRENCY), BATCHRUN_DEADLINE_MARGIN_MS="800"
    )
    context = FakeContext(1.6, "req-guarantees")
    first = aws_lambda.handle({"job": case.name, "period": case.period}, context, environ=environ)
    assert context.get_remaining_time_in_millis() > 0, "the handler must return in time"
    assert first["continuation"] is True and first["stopped"], first
    assert 0 < first["succeeded"] < len(ents.want), first

    results = drain_as_sqs_events(db_url, environ, seconds=1.6)
    assert results, "the continuation should have needed an invocation"
    assert all(r["batchItemFailures"] == [] for r in results), results
    # A hand-off is graceful: what was in flight finished, so nothing is doubled.
    assert_done_once(case, db_url, where=f"after {len(results) + 1} invocations")

"""Run history and control rows on every database: batchrun_run, batchrun_control, and
the ledger's run_id (see DESIGN.md, "See and steer")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.birthday import birthday_scope, seed
from support.db import query

from batchrun.control.history import History, iso, outcome_of
from batchrun.control.runrecord import RunRecord
from batchrun.control.steering import Controls, Steering
from batchrun.db import Store
from batchrun.period import parse
from batchrun.runtime import Runtime

JUNE = parse("month", "2025-06")


async def test_a_row_is_started_beaten_and_ended(store: Store) -> None:
    history = History(store.db, lease_s=60)
    run_id = await history.start(kind="run", job="birthday", period="2025-06")
    [row] = await history.runs()
    assert (row.id, row.outcome, row.ended_at, row.kind) == (run_id, "running", None, "run")
    await history.beat(run_id, {"done": 3})
    assert (await history.get(run_id)).counts == {"done": 3}  # type: ignore[union-attr]
    assert [r.id for r in await history.running()] == [run_id]
    await history.end(run_id, exit_code=3, outcome="retrying", counts={"failed": 1}, error="x")
    row = await history.get(run_id)  # type: ignore[assignment]
    assert row is not None
    assert (row.outcome, row.exit_code, row.counts, row.error) == (
        "retrying",
        3,
        {"failed": 1},
        "x",
    )
    assert row.ended_at is not None and row.ended_at >= row.started_at
    assert await history.running() == []
    assert (await history.last_per_job())["birthday"].id == run_id
    data = row.to_json()
    assert data["started_at"] == iso(row.started_at) and data["started_at"].endswith("Z")


async def test_newest_first_by_job_and_since(store: Store) -> None:
    history = History(store.db, lease_s=60)
    first = await history.start(kind="run", job="birthday", period="2025-06")
    second = await history.start(kind="worker", job=None, period=None)
    third = await history.start(kind="run", job="renewal", period="2025-06-01")
    assert [r.id for r in await history.runs()] == [third, second, first]
    assert [r.id for r in await history.runs("birthday")] == [first]
    assert [r.id for r in await history.runs(limit=2)] == [third, second]
    assert await history.runs(since_ms=(await history.get(third)).started_at + 10**6) == []  # type: ignore[union-attr]


async def test_a_silent_running_row_reads_crashed_then_is_marked(store: Store) -> None:
    history = History(store.db, lease_s=0.2)
    dead = await history.start(kind="run", job="birthday", period="2025-06")
    await asyncio.sleep(0.3)  # the lease passes without a heartbeat
    assert (await history.get(dead)).outcome == "crashed"  # type: ignore[union-attr]
    assert await history.running() == []
    assert (await history.last_per_job())["birthday"].outcome == "crashed"
    await history.start(kind="run", job="birthday", period="2025-06")  # the next run marks it
    rows = await store.db.fetchall("run_get", id=dead, stale=0)  # stale 0: as stored
    assert rows[0][11] == "crashed"


def test_outcomes_by_exit_code() -> None:
    assert [outcome_of(c) for c in (0, 3, 1, 2, 130)] == [
        "ok",
        "retrying",
        "failed",
        "failed",
        "stopped",
    ]
    assert outcome_of(130, "cancelled") == "cancelled"


async def test_control_rows_pause_resume_cancel(store: Store) -> None:
    controls = Controls(store.db)
    steering = Steering()
    await controls.pause("birthday", reason="SES complaints")
    await controls.pause("renewal", "2025-06-01")
    await steering.refresh(store.db)
    held = steering.paused("birthday", "2025-07")
    assert held is not None and held.reason == "SES complaints"
    assert steering.paused("renewal", "2025-06-01") is not None
    assert steering.paused("renewal", "2025-06-02") is None
    assert await controls.resume("birthday")
    assert not await controls.resume("birthday")  # nothing paused any more
    await steering.refresh(store.db)
    assert steering.paused("birthday", "2025-07") is None

    from batchrun.pipeline.engine import StopToken

    before, after = StopToken(), StopToken()
    done = steering.steer(before, job="birthday", period="2025-06")
    await asyncio.sleep(0.01)
    await controls.cancel("birthday", "2025-06")
    await asyncio.sleep(0.01)
    steering.steer(after, job="birthday", period="2025-06")  # started after the cancel
    await steering.refresh(store.db)
    assert before.stopping and before.reason == "cancelled"
    assert not after.stopping, "a cancel ends the runs going on, not later ones"
    done()


async def _recorded_run(rt: Runtime) -> tuple[RunRecord, Any]:
    """A June run with its history row, as ``batchrun birthday`` makes one."""
    async with RunRecord(rt, kind="run", job="birthday", period="2025-06") as record:
        summary = await rt.run(JUNE)
        await record.end(summary.exit_code, summary.to_json())
    return record, summary


def _ledger_run_ids(db_url: str) -> list[tuple[Any, ...]]:
    scope = birthday_scope()
    return query(
        db_url,
        "SELECT DISTINCT run_id FROM batchrun_ledger WHERE job = %s AND once_key = %s",
        scope.job,
        scope.once,
    )


async def test_a_run_records_its_run_on_the_ledger(
    db_url: str, make_job: Callable[..., Any], store: Store
) -> None:
    await seed(store, 300)
    rt: Runtime = await make_job(db_url)
    record, summary = await _recorded_run(rt)
    assert record.run_id is not None
    assert _ledger_run_ids(db_url) == [(record.run_id,)]
    history = History(rt.store.db, lease_s=60)
    row = await history.get(record.run_id)
    assert row is not None and row.outcome == "ok" and row.exit_code == 0
    assert row.counts is not None and row.counts["emails_sent"] == summary.emails_sent > 0


async def test_a_run_that_takes_over_expired_claims_records_itself_on_them(
    db_url: str, make_job: Callable[..., Any], store: Store
) -> None:
    """The rows a dead run (999) claimed and left are taken over with the new run's id,
    in the same statement that takes them (``claim_expired``)."""
    await seed(store, 120)
    rt: Runtime = await make_job(db_url)
    await rt.run(JUNE)  # every row claimed and finished, without a history row (NULL)
    scope = birthday_scope()
    query(
        db_url,
        "UPDATE batchrun_ledger SET state = 0, owner = 'dead', lease_until = 0, run_id = 999"
        " WHERE job = %s AND once_key = %s",
        scope.job,
        scope.once,
    )
    record, summary = await _recorded_run(rt)
    assert summary.eligible > 0 and summary.lost_claims == 0
    assert _ledger_run_ids(db_url) == [(record.run_id,)]


@pytest.mark.parametrize("paused_period", [None, "2025-06"])
async def test_a_run_started_while_paused_claims_nothing(
    db_url: str, make_job: Callable[..., Any], store: Store, paused_period: str | None
) -> None:
    await seed(store, 100)
    await Controls(store.db).pause("birthday", paused_period)
    rt: Runtime = await make_job(db_url)
    summary = await rt.run(JUNE)
    assert summary.to_json()["paused"] is True
    assert summary.exit_code == 0 and summary.eligible == 0
    assert query(db_url, "SELECT COUNT(*) FROM batchrun_ledger") == [(0,)]

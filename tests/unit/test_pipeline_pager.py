"""The pager (batchrun/pipeline/pager.py) on fakes: a page is checked against the job's
contract, finished entities are left out, what is claimed is prepared and yielded in id
order, what other runs hold is waited for and taken over once their lease ends, and
``--max-db-load`` pauses pages while the server is busy."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from collections.abc import Sequence
from typing import Any

import pytest

from batchrun.db.store import MAX_ID, Claim, Scope, State
from batchrun.errors import (
    DatabaseError,
    JobError,
    LockTimeoutError,
    NotMigratedError,
    OutcomeUnknownError,
    StatementError,
)
from batchrun.pipeline import pager
from batchrun.pipeline import pager as pager_module
from batchrun.pipeline.item import Item
from batchrun.pipeline.pager import LoadGate, Pager, again_after_lost, page, recheck, unfinished
from batchrun.pipeline.stop import StopToken

SCOPE = Scope("birthday", "2025", "2025-06")
ME = "me"


class FakeJob:
    """A job whose page returns ``rows`` (dicts with an ``id``) above ``after``."""

    name = "fake"
    address = "email"

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        self.rows = list(rows)
        self.prepared: list[list[int]] = []

    async def page(self, ctx: Any, after: int, limit: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["id"] > after][:limit]

    async def prepare(self, ctx: Any, rows: list[dict[str, Any]]) -> None:
        self.prepared.append([r["id"] for r in rows])


class FakeContext:
    def __init__(self) -> None:
        self.looked_up: list[list[str]] = []

    async def suppressed(self, addresses: list[str]) -> set[str]:
        self.looked_up.append(list(addresses))
        return set()


class FakeStore:
    """The ledger: entity id -> Claim; the server's clock in ms."""

    def __init__(self, ledger: dict[int, Claim] | None = None, *, now_ms: int = 1_000) -> None:
        self.ledger = ledger or {}
        self.now_ms = now_ms
        self.claims_of_calls = 0

    async def period_started(self, *, job: str, period: str) -> bool:
        return bool(self.ledger)

    async def claims_of(self, scope: Scope, ids: Sequence[int]) -> dict[int, Claim]:
        self.claims_of_calls += 1
        return {i: self.ledger[i] for i in ids if i in self.ledger}

    async def clock_ms(self) -> int:
        return self.now_ms


class FakeLease:
    """Claims every id nobody else holds with a live lease, keeping its attempts and whether
    a retry message waits for it, as the store's claim does."""

    me = ME

    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.claimed: list[list[int]] = []
        self.new: list[list[int]] = []

    async def fence(self) -> bool:
        return True

    async def claim(
        self, scope: Scope, ids: Sequence[int], new_ids: Sequence[int]
    ) -> dict[int, Claim]:
        self.claimed.append(list(ids))
        self.new.append(list(new_ids))
        out = {}
        for uid in ids:
            held = self.store.ledger.get(uid)
            live = held is not None and held.owner not in (None, ME)
            if live and (held.lease_until or 0) >= self.store.now_ms:
                out[uid] = held
            else:
                attempts, queued = (held.attempts, held.queued) if held else (0, False)
                lease_until = self.store.now_ms + 5_000
                out[uid] = Claim(uid, int(State.PENDING), ME, lease_until, attempts, queued)
                self.store.ledger[uid] = out[uid]
        return out


def rows(*ids: int) -> list[dict[str, Any]]:
    return [{"id": i, "email": f"u{i}@example.com"} for i in ids]


def make_pager(
    job: FakeJob, store: FakeStore, *, limit: int = 2, until: int = MAX_ID, **kw: Any
) -> tuple[Pager, list[int]]:
    claimed: list[int] = []
    p = Pager(
        job,  # type: ignore[arg-type]
        FakeContext(),  # type: ignore[arg-type]
        SCOPE,
        store=store,  # type: ignore[arg-type]
        lease=FakeLease(store),  # type: ignore[arg-type]
        stop=kw.pop("stop", StopToken()),
        page_limit=lambda: limit,
        on_claimed=claimed.append,
        until=until,
        poll_s=0.01,
        **kw,
    )
    return p, claimed


async def collect(p: Pager) -> list[Item]:
    return [item async for item in p.items()]


# -- page(): the job's contract --------------------------------------------------------------


async def test_page_returns_ascending_rows_above_after() -> None:
    job = FakeJob(rows(1, 2, 5))
    assert [r["id"] for r in await page(job, None, 1, 10)] == [2, 5]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([{"id": "1"}], "without an integer 'id'"),
        ([{"id": True}], "without an integer 'id'"),
        ([{"name": "no id"}], "without an integer 'id'"),
        ([{"id": 3}, {"id": 2}], "ids must be ascending"),
        ([{"id": 3}, {"id": 3}], "ids must be ascending"),
        ([{"id": 0}], "ids must be ascending and above `after`"),
        ([{"id": 1}, {"id": 2}, {"id": 3}], "returned 3 rows for limit 2"),
    ],
)
async def test_page_refuses_rows_that_break_the_contract(
    bad: list[dict[str, Any]], message: str
) -> None:
    class Broken(FakeJob):
        async def page(self, ctx: Any, after: int, limit: int) -> list[dict[str, Any]]:
            return bad

    with pytest.raises(JobError, match=message):
        await page(Broken([]), None, 0, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (None, "page\\(\\) returned NoneType, not a list of dicts"),
        ({"id": 1}, "page\\(\\) returned dict, not a list of dicts"),
        (KeyError("query parameter :limit not given"), "page\\(\\) raised KeyError: .*:limit"),
        (TypeError("'NoneType' object"), "page\\(\\) raised TypeError"),
        (StatementError("database x: no such table: subscription"), "page\\(\\): database x: no"),
    ],
)
async def test_a_page_that_fails_or_returns_no_list_is_one_line_naming_the_job(
    returned: object, message: str
) -> None:
    """A bare TypeError, KeyError or the database's line named neither the job nor its page."""

    class Broken(FakeJob):
        async def page(self, ctx: Any, after: int, limit: int) -> Any:
            if isinstance(returned, Exception):
                raise returned
            return returned

    with pytest.raises(JobError, match=f"^job 'fake': {message}"):
        await page(Broken([]), None, 0, 2)  # type: ignore[arg-type]


async def test_a_page_that_forgot_an_await_says_so_and_nothing_else_warns() -> None:
    class Forgetful(FakeJob):
        async def page(self, ctx: Any, after: int, limit: int) -> Any:
            return self.fetch()  # no await

        async def fetch(self) -> list[dict[str, Any]]:
            return []

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would raise
        with pytest.raises(JobError, match="page\\(\\) returned a coroutine: an await is missing"):
            await page(Forgetful([]), None, 0, 2)  # type: ignore[arg-type]
        gc.collect()


async def test_a_lock_wait_asks_again_while_patience_lasts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lock on the application's own tables (a long transaction) ended the run after
    three lock waits of its statement; the page goes again, as batchrun's writes do."""
    calls: list[int] = []

    async def locked_twice() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise LockTimeoutError("database x: (1205) Lock wait timeout exceeded")
        return "rows"

    assert await again_after_lost("page", locked_twice) == "rows" and len(calls) == 3
    monkeypatch.setattr(pager_module, "LOCK_PATIENCE_S", 0.3)
    error = LockTimeoutError("lock")

    async def always_locked() -> str:
        raise error

    with pytest.raises(LockTimeoutError) as caught:
        await again_after_lost("page", always_locked)
    assert caught.value is error
    # A stopping process (a signal, the Lambda's deadline) waits no longer.
    monkeypatch.setattr(pager_module, "LOCK_PATIENCE_S", 600.0)
    started = time.monotonic()
    with pytest.raises(LockTimeoutError):
        await again_after_lost("page", always_locked, stopping=lambda: True)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "error",
    [
        NotMigratedError("not migrated"),
        DatabaseError("database x: (1040) Too many connections"),  # an outage, not the job
    ],
)
async def test_batchruns_own_errors_pass_as_they_are(error: Exception) -> None:
    class Waiting(FakeJob):
        async def page(self, ctx: Any, after: int, limit: int) -> Any:
            raise error

    with pytest.raises(type(error)) as caught:
        await page(Waiting([]), None, 0, 2)  # type: ignore[arg-type]
    assert caught.value is error


async def test_recheck_is_the_row_only_while_the_page_still_returns_it() -> None:
    job = FakeJob(rows(4, 7))
    assert await recheck(job, None, 4) == rows(4)[0]  # type: ignore[arg-type]
    assert await recheck(job, None, 5) is None  # type: ignore[arg-type]  # 7 comes next, not 5


def test_unfinished_leaves_out_final_ledger_states_only() -> None:
    ledger = {
        1: Claim(1, int(State.SUCCEEDED), None, None),
        2: Claim(2, int(State.SKIPPED), None, None),
        3: Claim(3, int(State.FAILED), None, None),
        4: Claim(4, int(State.RETRYING), None, None),
        5: Claim(5, int(State.PENDING), "other", 1),
    }
    assert [r["id"] for r in unfinished(rows(1, 2, 3, 4, 5, 6), ledger)] == [4, 5, 6]


async def test_again_after_lost_asks_again_on_a_lost_reply_then_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(pager.asyncio, "sleep", no_wait)
    calls = 0

    async def twice_lost() -> str:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise OutcomeUnknownError("reply lost")
        return "rows"

    assert await again_after_lost("page", twice_lost) == "rows"
    assert calls == 3 and waits == [0.2, 0.4]  # backoff doubles

    async def always_lost() -> str:
        raise OutcomeUnknownError("reply lost")

    waits.clear()
    with pytest.raises(OutcomeUnknownError):
        await again_after_lost("page", always_lost)
    assert len(waits) == pager.ASK_AGAIN

    async def broken() -> str:
        raise JobError("a bug")

    waits.clear()
    with pytest.raises(JobError):
        await again_after_lost("page", broken)
    assert waits == [], "only a lost reply goes again"


# -- Pager: claim, prepare, yield ------------------------------------------------------------


async def test_every_page_is_claimed_prepared_and_yielded_in_id_order() -> None:
    job = FakeJob(rows(1, 2, 3, 5, 8))
    store = FakeStore()
    p, claimed = make_pager(job, store, limit=2)
    items = await collect(p)
    assert [i.id for i in items] == [1, 2, 3, 5, 8]
    assert all(i.scope == SCOPE and i.row["id"] == i.id for i in items)
    assert job.prepared == [[1, 2], [3, 5], [8]], "prepare once a page, with its claimed rows"
    assert claimed == [2, 2, 1]
    assert p.ctx.looked_up == [  # type: ignore[attr-defined]
        ["u1@example.com", "u2@example.com"],
        ["u3@example.com", "u5@example.com"],
        ["u8@example.com"],
    ], "the page's addresses are looked up on the suppression list before prepare"
    assert p.done and p.cursor == 8
    assert store.claims_of_calls == 0, "a period nobody started needs no ledger look-up"


async def test_finished_entities_are_neither_claimed_nor_yielded() -> None:
    job = FakeJob(rows(1, 2, 3, 4))
    store = FakeStore(
        {
            2: Claim(2, int(State.SUCCEEDED), None, None),
            3: Claim(3, int(State.RETRYING), None, None, attempts=1, queued=True),
        }
    )
    p, _ = make_pager(job, store, limit=10)
    items = await collect(p)
    assert [i.id for i in items] == [1, 3, 4]
    (three,) = [i for i in items if i.id == 3]
    assert (three.attempts, three.queued) == (1, True), "the ledger's attempts and queued"
    lease: FakeLease = p.lease  # type: ignore[assignment]
    assert lease.claimed == [[1, 3, 4]]
    assert lease.new == [[1, 4]], "ids without a ledger row are inserted, not updated"


async def test_ids_past_until_are_left_to_the_next_range() -> None:
    job = FakeJob(rows(1, 2, 3, 4, 5))
    p, _ = make_pager(job, FakeStore(), limit=2, until=3)
    assert [i.id for i in await collect(p)] == [1, 2, 3]
    assert p.done


async def test_a_share_used_up_ends_the_pages() -> None:
    job = FakeJob(rows(1, 2))
    p, claimed = make_pager(job, FakeStore(), limit=0)
    assert await collect(p) == []
    assert p.done and claimed == []


async def test_entities_another_run_holds_are_taken_over_once_its_lease_ends() -> None:
    job = FakeJob(rows(1, 2, 3))
    store = FakeStore({2: Claim(2, int(State.PENDING), "other", 1_500)}, now_ms=1_000)
    p, _ = make_pager(job, store, limit=10)
    seen: list[int] = []

    async def run() -> None:
        async for item in p.items():
            seen.append(item.id)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.05)
    assert seen == [1, 3] and p.foreign == {2}, "a live claim of another run is waited for"
    store.now_ms = 2_000  # its lease ended
    await asyncio.wait_for(task, 2)
    assert seen == [1, 3, 2] and p.done and p.foreign == set()


async def test_an_entity_another_run_finished_meanwhile_is_not_taken() -> None:
    job = FakeJob(rows(1, 2))
    store = FakeStore({2: Claim(2, int(State.PENDING), "other", 99_000)}, now_ms=1_000)
    p, _ = make_pager(job, store, limit=10)
    seen: list[int] = []

    async def run() -> None:
        async for item in p.items():
            seen.append(item.id)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.05)
    store.ledger[2] = Claim(2, int(State.SUCCEEDED), None, None)
    await asyncio.wait_for(task, 2)
    assert seen == [1] and p.done


async def test_a_stop_while_waiting_for_another_run_leaves_the_pager_not_done() -> None:
    job = FakeJob(rows(1, 2))
    store = FakeStore({2: Claim(2, int(State.PENDING), "other", 99_000)}, now_ms=1_000)
    stop = StopToken()
    p, _ = make_pager(job, store, limit=10, stop=stop)
    seen: list[int] = []

    async def run() -> None:
        async for item in p.items():
            seen.append(item.id)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.05)
    stop.request("test")
    await asyncio.wait_for(task, 2)
    assert seen == [1] and not p.done


async def test_claim_rest_claims_the_remaining_share_without_prepare() -> None:
    job = FakeJob(rows(1, 2, 3, 4, 5))
    share = [3]
    p, claimed = make_pager(job, FakeStore(), limit=10)
    p.page_limit = lambda: share[0]

    def on_claimed(n: int) -> None:
        share[0] -= n
        claimed.append(n)

    p.on_claimed = on_claimed
    await p.claim_rest()
    assert [i.id for i in p.unyielded] == [1, 2, 3]
    assert job.prepared == [], "a share claimed to be queued is not prepared"
    assert claimed == [3]


# -- LoadGate ---------------------------------------------------------------------------------


class BusyDb:
    def __init__(self, *readings: int | None) -> None:
        self.readings = list(readings)

    async def threads_running(self) -> int | None:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


async def test_the_load_gate_passes_without_a_limit_or_below_it() -> None:
    for gate in (
        LoadGate(BusyDb(50), None, StopToken()),  # type: ignore[arg-type]
        LoadGate(BusyDb(3), 3, StopToken()),  # type: ignore[arg-type]
        LoadGate(BusyDb(None), 1, StopToken()),  # type: ignore[arg-type]  # SQLite
    ):
        await asyncio.wait_for(gate.wait(), 1)
        assert gate.pauses == 0 and gate.paused_s == 0.0


async def test_the_load_gate_pauses_until_the_load_falls_back() -> None:
    gate = LoadGate(BusyDb(9, 9, 9, 2), 4, StopToken(), poll_s=0.01)  # type: ignore[arg-type]
    await asyncio.wait_for(gate.wait(), 2)
    assert gate.pauses == 1 and gate.paused_s >= 0.02


async def test_a_stop_ends_the_load_gates_wait() -> None:
    stop = StopToken()
    gate = LoadGate(BusyDb(9), 4, stop, poll_s=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(gate.wait())
    await asyncio.sleep(0.03)
    assert not task.done()
    stop.request("test")
    await asyncio.wait_for(task, 1)
    assert gate.pauses == 1

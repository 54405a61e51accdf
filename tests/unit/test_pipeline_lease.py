"""The lease (batchrun/pipeline/lease.py) on a fake store: what a run holds, what a
heartbeat finds lost, what an outcome write finds lost, and the fence that holds workers
while the claims are not known to be alive."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import pytest

from batchrun.db.store import Claim, Scope, State
from batchrun.pipeline.item import Item
from batchrun.pipeline.lease import Lease
from batchrun.pipeline.stop import StopToken

SCOPE = Scope("birthday", "2025", "2025-06")


class FakeStore:
    """The ledger rows' owners; a heartbeat renews the rows ``me`` still owns."""

    def __init__(self) -> None:
        self.owner: dict[int, str | None] = {}
        self.state: dict[int, int] = {}
        self.released: list[list[int]] = []
        self.fail_heartbeat = False
        self.heartbeats = 0

    async def claim(
        self, scope: Scope, *, ids: Sequence[int], new_ids: Iterable[int], me: str, lease_ms: int
    ) -> dict[int, Claim]:
        out = {}
        for uid in ids:
            if self.owner.get(uid) is None and self.state.get(uid, 0) == State.PENDING:
                self.owner[uid] = me
            out[uid] = Claim(uid, self.state.get(uid, 0), self.owner.get(uid), 10_000)
        return out

    async def release(self, scope: Scope, *, ids: Sequence[int], me: str) -> None:
        self.released.append(list(ids))
        for uid in ids:
            if self.owner.get(uid) == me:
                self.owner[uid] = None

    async def heartbeat(self, scope: Scope, *, lo: int, hi: int, me: str, lease_ms: int) -> int:
        self.heartbeats += 1
        if self.fail_heartbeat:
            raise ConnectionError("database gone")
        return sum(1 for uid, o in self.owner.items() if lo <= uid <= hi and o == me)

    async def claims_of(self, scope: Scope, ids: Sequence[int]) -> dict[int, Claim]:
        return {u: Claim(u, self.state.get(u, 0), self.owner.get(u), 10_000) for u in ids}


def lease_on(store: FakeStore, *, lease_s: float = 30.0, stop: StopToken | None = None) -> Lease:
    return Lease(store, lease_s=lease_s, stop=stop or StopToken())  # type: ignore[arg-type]


async def test_a_claim_holds_what_this_run_owns_and_nothing_else() -> None:
    store = FakeStore()
    store.owner[2] = "another run"
    store.state[3] = int(State.SUCCEEDED)
    lease = lease_on(store)
    claims = await lease.claim(SCOPE, [1, 2, 3, 4], [1, 4])
    assert {u: c.owner for u, c in claims.items()} == {
        1: lease.me,
        2: "another run",
        3: None,
        4: lease.me,
    }
    assert lease.holding() and list(lease.held_scopes()) == [SCOPE]
    lease.let_go(SCOPE, [1])
    assert lease.holding()
    lease.let_go(SCOPE, [4])
    assert not lease.holding() and list(lease.held_scopes()) == []


async def test_release_lets_go_first_and_gives_the_rows_back() -> None:
    store = FakeStore()
    lease = lease_on(store)
    await lease.claim(SCOPE, [1, 2], [1, 2])
    await lease.release(SCOPE, [1, 2])
    assert not lease.holding()
    assert store.released == [[1, 2]] and store.owner == {1: None, 2: None}


async def test_a_heartbeat_finds_the_claims_another_run_took_over() -> None:
    store = FakeStore()
    lease = lease_on(store)
    await lease.claim(SCOPE, [1, 2, 3], [1, 2, 3])
    store.owner[2] = "another run"  # its lease expired and another run claimed it
    assert await lease.renew()
    assert lease.lost(Item(SCOPE, 2)) and not lease.lost(Item(SCOPE, 1))
    assert lease.lost_claims == 1
    await lease.renew()
    assert lease.lost_claims == 1, "a lost claim is counted once"


async def test_a_heartbeat_that_renews_every_row_loses_nothing() -> None:
    store = FakeStore()
    lease = lease_on(store)
    await lease.claim(SCOPE, [1, 2], [1, 2])
    assert await lease.renew()
    assert lease.lost_claims == 0 and not lease.lost(Item(SCOPE, 1))


async def test_an_outcome_write_counts_what_it_found_lost_once() -> None:
    store = FakeStore()
    lease = lease_on(store)
    await lease.claim(SCOPE, [1, 2, 3, 4], [1, 2, 3, 4])
    assert lease.note_lost(SCOPE, [1, 2], changed=2, what="recorded them") == 0
    assert lease.note_lost(SCOPE, [1, 2], changed=1, what="recorded them") == 1
    store.owner[3] = "another run"
    await lease.renew()  # the heartbeat found 3 first
    assert lease.lost_claims == 2
    assert lease.note_lost(SCOPE, [3, 4], changed=1, what="recorded them") == 0
    assert lease.lost_claims == 2, "3 was counted by the heartbeat already"


async def test_past_its_lease_the_fence_holds_until_a_heartbeat_succeeds() -> None:
    store = FakeStore()
    lease = lease_on(store, lease_s=0.1)  # valid for 0.08 s (a 0.02 s margin)
    await lease.claim(SCOPE, [1], [1])
    assert lease.valid()
    await asyncio.sleep(0.1)
    assert not lease.valid()
    store.fail_heartbeat = True
    assert not await lease.renew(), "a failed heartbeat renews nothing"
    assert not lease.valid()
    fenced = asyncio.create_task(lease.fence())
    await asyncio.sleep(0.05)
    assert not fenced.done(), "workers wait at the fence"
    store.fail_heartbeat = False
    assert await lease.renew()
    assert await asyncio.wait_for(fenced, 1) is True
    assert lease.valid()


async def test_a_stop_opens_the_fence_with_false() -> None:
    stop = StopToken()
    lease = lease_on(FakeStore(), lease_s=0.05, stop=stop)
    await lease.claim(SCOPE, [1], [1])
    await asyncio.sleep(0.06)
    fenced = asyncio.create_task(lease.fence())
    await asyncio.sleep(0.02)
    stop.request("test")
    assert await asyncio.wait_for(fenced, 1) is False


async def test_nothing_held_makes_the_lease_young_again() -> None:
    lease = lease_on(FakeStore(), lease_s=0.05)
    await asyncio.sleep(0.06)
    assert not lease.valid()
    lease.young()
    assert lease.valid(), "an idle worker's next claim starts a fresh lease"


async def test_the_heartbeat_task_renews_while_the_lease_is_entered() -> None:
    store = FakeStore()
    async with lease_on(store, lease_s=0.15) as lease:
        await lease.claim(SCOPE, [1], [1])
        await asyncio.sleep(0.2)
        assert store.heartbeats >= 2 and lease.valid()
    beats = store.heartbeats
    await asyncio.sleep(0.1)
    assert store.heartbeats == beats, "leaving the lease stops its heartbeat"


@pytest.mark.parametrize("lease_s", [1.0, 15.0])
def test_the_safety_margin_is_a_fifth_of_the_lease_at_most_a_second(lease_s: float) -> None:
    async def make() -> Lease:
        return lease_on(FakeStore(), lease_s=lease_s)

    lease = asyncio.run(make())
    assert lease.margin_s == min(1.0, lease_s / 5)
    assert lease.lease_ms == int(lease_s * 1000)

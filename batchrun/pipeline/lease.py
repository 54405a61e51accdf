"""The claims one run (or one consumer batch) holds: kept alive by a heartbeat, and fenced.

A claim is a ledger row whose ``owner`` is this lease and whose ``lease_until`` is in the
future. Another run takes a claim over once its lease has expired, so a run that cannot
renew its claims in time (its heartbeat blocked on a row lock, the process paused by
SIGSTOP or a closed laptop lid) must not go on working on them. The fence:

- ``valid_until`` (monotonic) is the start of the last heartbeat that succeeded plus the
  lease, less a safety margin: until then every claim is certainly still ours;
- past it, ``fence()`` holds every worker before its next effect until a heartbeat
  succeeds again, and that heartbeat tells which claims were lost meanwhile (fewer rows
  renewed than held): those entities are dropped, not worked, and counted ``lost_claims``;
- an outcome write that changes fewer rows than it names means the same, after the fact.

So the entities a run works on after losing them are at most those already in flight when
its lease ran out: ``concurrency``, the same bound a crash has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Self

from batchrun.control.steering import Steering
from batchrun.db.store import FINAL_STATES, Claim, Scope, Store
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.item import Item

log = logging.getLogger(__name__)


class Fence:
    """A heartbeat and the fence it keeps: the base of every kind of claim a process holds
    (entities of a period in ``Lease``, submitted tasks in ``pipeline.tasks``).

    ``renew_held`` (the subclass's) extends what is held and finds what was lost; until
    ``valid_until`` every claim is certainly still this process's, past it ``fence``
    holds every worker before its next effect until a heartbeat succeeds again.
    """

    def __init__(
        self, *, lease_s: float, stop: StopToken, steering: Steering | None = None
    ) -> None:
        self.steering = steering  # pause holds the fence; cancel stops ``stop``
        self.me = uuid.uuid4().hex
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self.stop = stop
        self.margin_s = min(1.0, lease_s / 5)
        self.lost_claims = 0
        self._valid_until = time.monotonic() + lease_s - self.margin_s
        self._renewed = asyncio.Event()
        self._beat: asyncio.Task[None] | None = None
        self._scopes: set[Scope] = set()  # every scope claimed in: what a cancel may name
        self._unsteer: Callable[[], None] | None = None

    async def __aenter__(self) -> Self:
        if self.steering is not None:
            self._unsteer = self.steering.steer(self.stop, scopes=self._scopes)
        self._beat = asyncio.create_task(self._heartbeat(), name="batchrun-heartbeat")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unsteer is not None:
            self._unsteer()
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat

    def holding(self) -> bool:
        """Whether any claim is held (the subclass's)."""
        raise NotImplementedError

    def held_scopes(self) -> Iterable[Scope]:
        """The scopes of the claims held, for pause (the subclass's)."""
        raise NotImplementedError

    def lost(self, item: Item) -> bool:
        """Whether another process took this item's claim over (the subclass's)."""
        raise NotImplementedError

    async def renew_held(self) -> None:
        """Extend every claim held; note those lost (the subclass's)."""
        raise NotImplementedError

    def young(self) -> None:
        """Nothing is held: the lease is as young as the next claim (a long idle worker,
        or a fence lifted by letting everything go)."""
        if not self.holding():
            self._valid_until = time.monotonic() + self.lease_s - self.margin_s

    # -- the fence ------------------------------------------------------------------------

    def valid(self) -> bool:
        """Whether every claim held is certainly still ours."""
        return time.monotonic() < self._valid_until

    def paused(self) -> bool:
        """Whether ``batchrun pause`` holds the job of a claim held."""
        return self.steering is not None and self.steering.any_paused(self.held_scopes())

    async def fence(self) -> bool:
        """Wait until the claims are known to be alive and their job is not paused;
        False if the run stops first."""
        while not self.valid() or self.paused():
            if self.stop.stopping:
                return False
            self._renewed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renewed.wait(), timeout=0.25)
        return True

    async def _heartbeat(self) -> None:
        while True:
            # A stale lease is renewed at once and then often: workers are waiting on it.
            await asyncio.sleep(self.lease_s / 3 if self.valid() else min(0.5, self.lease_s / 6))
            await self.renew()

    async def renew(self) -> bool:
        """Extend every claim held; find the ones lost. False if the database failed."""
        started = time.monotonic()
        try:
            await self.renew_held()
        except Exception as exc:
            log.warning("heartbeat failed (claims are fenced until one succeeds): %s", exc)
            return False
        if not self.valid():
            log.info("heartbeat succeeded again: claims renewed")
        self._valid_until = started + self.lease_s - self.margin_s
        self._renewed.set()
        return True


class Lease(Fence):
    """The ledger claims of one owner (a run, or one consumer batch), kept alive and fenced."""

    def __init__(
        self, store: Store, *, lease_s: float, stop: StopToken, steering: Steering | None = None
    ) -> None:
        super().__init__(lease_s=lease_s, stop=stop, steering=steering)
        self.store = store
        self._held: dict[Scope, set[int]] = {}
        self._lost: set[tuple[Scope, int]] = set()

    # -- claims ---------------------------------------------------------------------------

    async def claim(
        self, scope: Scope, ids: Sequence[int], new_ids: Iterable[int]
    ) -> dict[int, Claim]:
        """Claim ``ids`` (``new_ids`` have no ledger row yet); return every id's row."""
        self.young()
        claims = await self.store.claim(
            scope, ids=ids, new_ids=new_ids, me=self.me, lease_ms=self.lease_ms
        )
        held = self._held.setdefault(scope, set())
        mine = [u for u, c in claims.items() if c.owner == self.me and c.state not in FINAL_STATES]
        held.update(mine)
        self._scopes.add(scope)
        return claims

    def let_go(self, scope: Scope, ids: Iterable[int]) -> None:
        """Forget claims that were finished or released."""
        held = self._held.get(scope)
        if held is not None:
            held.difference_update(ids)
            if not held:
                del self._held[scope]

    async def release(self, scope: Scope, ids: Sequence[int]) -> None:
        """Let go of unfinished claims so the next run takes them at once."""
        self.let_go(scope, ids)  # first, as the recorder does (a heartbeat in between)
        await self.store.release(scope, ids=ids, me=self.me)

    def holding(self) -> bool:
        return any(self._held.values())

    def held_scopes(self) -> Iterable[Scope]:
        return self._held

    def lost(self, item: Item) -> bool:
        """Whether another run took this entity's claim over."""
        return (item.scope, item.id) in self._lost

    def note_lost(self, scope: Scope, ids: Sequence[int], changed: int, what: str) -> int:
        """Count the claims an outcome write for ``ids`` found lost after the fact (it changed
        only ``changed`` rows); return how many were not known lost already.

        A heartbeat may have found some of them first (an entity in flight when it ran):
        those never changed and are counted once, by the heartbeat.
        """
        known = sum(1 for uid in ids if (scope, uid) in self._lost)
        count = len(ids) - changed - known
        if count <= 0:
            return 0
        self.lost_claims += count
        log.warning(
            "%s: %d claims of %s %s were taken over by another run before this one %s "
            "(its lease had expired)",
            self.me[:8],
            count,
            scope.job,
            scope.period,
            what,
        )
        return count

    async def renew_held(self) -> None:
        for scope, held in list(self._held.items()):
            if not held:
                continue
            snapshot = set(held)
            renewed = await self.store.heartbeat(
                scope, lo=min(snapshot), hi=max(snapshot), me=self.me, lease_ms=self.lease_ms
            )
            if renewed != len(snapshot):
                # Outcome writes run alongside (and claims); only the rows still held
                # and owned by someone else (or by no one) are really lost.
                await self._find_lost(scope, snapshot)

    async def _find_lost(self, scope: Scope, snapshot: set[int]) -> None:
        claims = await self.store.claims_of(scope, sorted(snapshot))
        held = self._held.get(scope, set())
        lost = [
            uid
            for uid in snapshot
            if uid in held and ((c := claims.get(uid)) is None or c.owner != self.me)
        ]
        if not lost:
            return
        held.difference_update(lost)
        self._lost.update((scope, uid) for uid in lost)
        self.lost_claims += len(lost)
        log.warning(
            "%s: lost %d claims of %s %s to another run (this run's lease expired: paused "
            "or stalled); it will not work on them",
            self.me[:8],
            len(lost),
            scope.job,
            scope.period,
        )

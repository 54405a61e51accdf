"""Backend slots shared through the database: a backend's ``concurrency`` held across every
process and Lambda (``Backend(concurrency=N, shared=True)``).

``batchrun_backend_slot`` has one row per (backend, slot), ``0 <= slot < N``. A call takes
a free slot (or one whose lease is over) with a guarded UPDATE, so two owners never hold
one slot; the lease is set and compared on the database server's clock (``clock_ms``),
renewed every third of it while the call runs, and let go when the call ends. A process
killed mid-call frees its slot when the lease runs out (``BATCHRUN_LEASE_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from dataclasses import dataclass

from batchrun.db.base import Database
from batchrun.errors import BatchrunError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Slot:
    """One slot held: which, and the task that keeps its lease alive."""

    number: int
    keeper: asyncio.Task[None]


class SharedSlots:
    """The slots of one backend in ``db``, taken by this owner (one per process's gate).

    Args:
        db: batchrun's database (its ``batchrun_backend_slot`` table).
        backend: the backend's name.
        slots: its concurrency: slots 0 .. slots-1.
        lease_s: how long a taken slot is held without a renewal.
    """

    def __init__(self, db: Database, backend: str, slots: int, *, lease_s: float) -> None:
        self.db = db
        self.backend = backend
        self.slots = slots
        self.lease_ms = max(1, int(lease_s * 1000))
        self.me = uuid.uuid4().hex
        self._made = False
        self.lost = 0  # leases found taken over while a call held them

    async def take(self) -> Slot | None:
        """A free slot, leased to this owner; None while every slot is held."""
        if not self._made:
            rows = [(self.backend, n, None, 0) for n in range(self.slots)]
            await self.db.execute("slot_insert", rows=rows)
            self._made = True
        now = await self.db.clock_ms()
        free = [
            int(r[0])
            for r in await self.db.fetchall(
                "slot_free", backend=self.backend, slots=self.slots, now=now
            )
        ]
        random.shuffle(free)  # owners that looked at once try different slots first
        for number in free:
            taken = await self.db.execute(
                "slot_take",
                backend=self.backend,
                slot=number,
                me=self.me,
                until=now + self.lease_ms,
                now=now,
            )
            if taken:
                return Slot(number, asyncio.create_task(self._keep(number)))
        return None

    async def release(self, slot: Slot) -> None:
        """Let the slot go (its keeper stops first, so it is not renewed after)."""
        slot.keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slot.keeper
        try:
            await self.db.execute(
                "slot_release", backend=self.backend, slot=slot.number, me=self.me
            )
        except BatchrunError as exc:  # its lease ends it instead
            log.warning("backend %s: slot %d not released: %s", self.backend, slot.number, exc)

    async def _keep(self, number: int) -> None:
        """Renew the slot's lease every third of it while the call runs."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                until = await self.db.clock_ms() + self.lease_ms
                renewed = await self.db.execute(
                    "slot_extend", backend=self.backend, slot=number, me=self.me, until=until
                )
            except BatchrunError as exc:
                log.warning("backend %s: slot %d not renewed: %s", self.backend, number, exc)
                continue
            if not renewed:
                # This process stalled past its lease and another took the slot: the call
                # in flight now overlaps one of theirs; nothing here can undo that.
                self.lost += 1
                log.warning(
                    "backend %s: slot %d was taken over (this process's lease ran out)",
                    self.backend,
                    number,
                )
                return


__all__ = ["SharedSlots", "Slot"]

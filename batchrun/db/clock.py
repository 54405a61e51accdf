"""The database server's clock without a statement each time: for timestamps written often
(a queue table's ``visible_at``, a task's ``created_at``) that must agree across hosts whose
clocks differ by minutes."""

from __future__ import annotations

import time
import weakref

from batchrun.db.base import Database, now_ms

REFRESH_S = 60.0  # a host's clock is off by a steady amount; NTP slews it slowly
STEP_MS = 1000  # this host's clock moved this much against the monotonic one: measure again
SLOW_READ_MS = 100  # a read that took longer (a busy pool) is kept only for a second


class ServerClock:
    """Epoch ms on the server's clock: this host's clock plus their difference, measured
    with one ``clock_ms`` statement at most every ``refresh_s`` (none on SQLite, whose
    clock is this host's). Measured again at once when this host's clock is stepped (set
    by hand, or by NTP), and within a second when a measurement was slow to read (its
    error is up to half the read)."""

    def __init__(self, db: Database, *, refresh_s: float = REFRESH_S) -> None:
        self.db = db
        self.refresh_s = refresh_s
        self._offset_ms = 0
        self._wall_ms = 0  # this host's clock at the last measurement ...
        self._monotonic = -float("inf")  # ... and the monotonic clock then
        self._good_for_s = 0.0

    async def now_ms(self) -> int:
        wall, monotonic = now_ms(), time.monotonic()
        elapsed = monotonic - self._monotonic
        stepped = abs(wall - self._wall_ms - elapsed * 1000) > STEP_MS
        if elapsed >= self._good_for_s or stepped:
            server = await self.db.clock_ms()
            after = now_ms()
            self._offset_ms = server - (wall + after) // 2  # the read's midpoint
            self._wall_ms, self._monotonic = wall, monotonic
            self._good_for_s = self.refresh_s if after - wall <= SLOW_READ_MS else 1.0
            return after + self._offset_ms
        return wall + self._offset_ms


_CLOCKS: weakref.WeakKeyDictionary[Database, ServerClock] = weakref.WeakKeyDictionary()


def server_clock(db: Database) -> ServerClock:
    """The one ``ServerClock`` of ``db``, shared by what writes times through it."""
    clock = _CLOCKS.get(db)
    if clock is None:
        clock = _CLOCKS[db] = ServerClock(db)
    return clock

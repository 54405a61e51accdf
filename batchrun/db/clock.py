"""The database server's clock, read once a minute: for timestamps written often (a queue
table's ``visible_at``) that must agree across hosts whose clocks differ by minutes."""

from __future__ import annotations

import time
import weakref

from batchrun.db.base import Database, now_ms

REFRESH_S = 60.0  # a host's clock is off by a steady amount; NTP slews it slowly


class ServerClock:
    """Epoch ms on the server's clock: this host's clock plus their difference, measured
    with one ``clock_ms`` statement at most every ``refresh_s`` (none on SQLite, whose
    clock is this host's)."""

    def __init__(self, db: Database, *, refresh_s: float = REFRESH_S) -> None:
        self.db = db
        self.refresh_s = refresh_s
        self._offset_ms: int | None = None
        self._measured_at = 0.0  # monotonic

    async def now_ms(self) -> int:
        if self._offset_ms is None or time.monotonic() - self._measured_at >= self.refresh_s:
            before = now_ms()
            server = await self.db.clock_ms()
            self._offset_ms = server - (before + now_ms()) // 2  # the read's midpoint
            self._measured_at = time.monotonic()
        return now_ms() + self._offset_ms


_CLOCKS: weakref.WeakKeyDictionary[Database, ServerClock] = weakref.WeakKeyDictionary()


def server_clock(db: Database) -> ServerClock:
    """The one ``ServerClock`` of ``db``, shared by what writes times through it."""
    clock = _CLOCKS.get(db)
    if clock is None:
        clock = _CLOCKS[db] = ServerClock(db)
    return clock

"""``ServerClock``: this host's clock plus the server's difference, read once per refresh."""

from __future__ import annotations

from typing import Any, cast

from batchrun.db.base import Database, now_ms
from batchrun.db.clock import ServerClock, server_clock


class AheadServer:
    """A server whose clock is ``ahead_ms`` past this host's; counts its clock reads."""

    def __init__(self, ahead_ms: int) -> None:
        self.ahead_ms = ahead_ms
        self.reads = 0

    async def clock_ms(self) -> int:
        self.reads += 1
        return now_ms() + self.ahead_ms


async def test_the_servers_time_from_one_read_per_refresh() -> None:
    server = AheadServer(600_000)
    clock = ServerClock(cast(Database, server), refresh_s=3600)
    for _ in range(5):
        assert abs(await clock.now_ms() - (now_ms() + 600_000)) < 1_000
    assert server.reads == 1
    server.ahead_ms = -120_000  # the host's clock was stepped: seen at the next refresh
    clock.refresh_s = 0
    assert abs(await clock.now_ms() - (now_ms() - 120_000)) < 1_000
    assert server.reads == 2


def test_one_clock_per_database() -> None:
    a, b = cast(Any, AheadServer(0)), cast(Any, AheadServer(0))
    assert server_clock(a) is server_clock(a) and server_clock(a) is not server_clock(b)

"""``ServerClock``: this host's clock plus the server's difference, read once per refresh,
and again when this host's clock is stepped or a read was slow."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from batchrun.db import clock as clock_module
from batchrun.db.base import Database, now_ms
from batchrun.db.clock import ServerClock, server_clock


class AheadServer:
    """A server whose clock is ``ahead_ms`` past this host's; counts its clock reads."""

    def __init__(self, ahead_ms: int, read_s: float = 0.0) -> None:
        self.ahead_ms = ahead_ms
        self.read_s = read_s
        self.reads = 0

    async def clock_ms(self) -> int:
        self.reads += 1
        await asyncio.sleep(self.read_s)
        return now_ms() + self.ahead_ms


async def test_the_servers_time_from_one_read_per_refresh() -> None:
    server = AheadServer(600_000)
    clock = ServerClock(cast(Database, server), refresh_s=3600)
    for _ in range(5):
        assert abs(await clock.now_ms() - (now_ms() + 600_000)) < 1_000
    assert server.reads == 1


async def test_a_step_of_this_hosts_clock_is_measured_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = AheadServer(0)
    clock = ServerClock(cast(Database, server), refresh_s=3600)
    assert abs(await clock.now_ms() - now_ms()) < 1_000
    # This host's clock is set back a minute (NTP corrects it); the server's is not.
    monkeypatch.setattr(clock_module, "now_ms", lambda: now_ms() - 60_000)
    assert abs(await clock.now_ms() - now_ms()) < 1_000, "still the server's time"
    assert server.reads == 2


async def test_a_slow_read_is_kept_for_a_second_only() -> None:
    server = AheadServer(5_000, read_s=0.15)
    clock = ServerClock(cast(Database, server), refresh_s=3600)
    await clock.now_ms()
    server.read_s = 0.0
    await clock.now_ms()
    assert server.reads == 1, "kept meanwhile"
    await asyncio.sleep(1.05)
    assert abs(await clock.now_ms() - (now_ms() + 5_000)) < 50
    assert server.reads == 2
    await clock.now_ms()
    assert server.reads == 2, "a quick read is good for the refresh"


def test_one_clock_per_database() -> None:
    a, b = cast(Any, AheadServer(0)), cast(Any, AheadServer(0))
    assert server_clock(a) is server_clock(a) and server_clock(a) is not server_clock(b)

"""AdaptiveRate: the AIMD law, pacing, and a simulated provider, all on fake time."""

from __future__ import annotations

import asyncio
import itertools
import selectors
import statistics
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from batchrun.errors import PermanentMailError, ThrottledError
from batchrun.policy.rate import AdaptiveRate

T = TypeVar("T")


class FakeClock:
    """A clock that only moves when someone sleeps on it (one sender at a time)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay
        await asyncio.sleep(0)


class _VirtualSelector(selectors.DefaultSelector):
    """Never blocks: a wait for the next timer moves the loop's virtual clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("virtual time: every task waits and no timer is set (deadlock)")
        self._loop.virtual_now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, like aiolimiter's MockLoopTime: sleeps cost nothing."""

    def __init__(self) -> None:
        self.virtual_now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self.virtual_now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)


def loop_limiter(initial: float, **kwargs: Any) -> AdaptiveRate:
    """An AdaptiveRate on the running (virtual-time) loop's clock."""
    loop = asyncio.get_running_loop()
    return AdaptiveRate(initial, clock=loop.time, sleep=asyncio.sleep, **kwargs)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(clock: FakeClock, initial: float, **kwargs: Any) -> AdaptiveRate:
    return AdaptiveRate(initial, clock=clock, sleep=clock.sleep, **kwargs)


async def send_for(limiter: AdaptiveRate, clock: FakeClock, seconds: float) -> int:
    """Send back to back, every send accepted, until ``seconds`` of fake time passed."""
    end = clock.now + seconds
    sent = 0
    while clock.now < end:
        async with limiter:
            sent += 1
    return sent


# -- the AIMD law -------------------------------------------------------------------------


def test_a_throttle_halves_the_rate(clock: FakeClock) -> None:
    limiter = make(clock, 16.0)
    assert limiter.throttled() is True
    assert limiter.rate == 8.0
    clock.now += 1.0
    assert limiter.throttled() is True
    assert limiter.rate == 4.0
    assert (limiter.throttles, limiter.decreases, limiter.peak) == (2, 2, 16.0)


def test_throttles_within_one_window_halve_once(clock: FakeClock) -> None:
    limiter = make(clock, 16.0, window_s=1.0)
    results = []
    for _ in range(10):  # the sends in flight when the provider pushed back
        results.append(limiter.throttled())
        clock.now += 0.09
    assert results == [True] + [False] * 9
    assert limiter.rate == 8.0
    assert (limiter.throttles, limiter.decreases) == (10, 1)
    clock.now += 0.2  # now 1.01 s after the first: a new window
    assert limiter.throttled() is True
    assert limiter.rate == 4.0


async def test_success_grows_the_rate_linearly_at_the_configured_slope(clock: FakeClock) -> None:
    limiter = make(clock, 5.0, increase=2.0)
    start = clock.now
    await send_for(limiter, clock, 5.0)
    assert limiter.rate == pytest.approx(5.0 + 2.0 * (clock.now - start), abs=0.5)
    assert limiter.rate == pytest.approx(15.0, abs=0.5)
    await send_for(limiter, clock, 5.0)
    assert limiter.rate == pytest.approx(25.0, abs=0.5)
    assert limiter.peak == limiter.rate


async def test_the_rate_never_exceeds_the_ceiling(clock: FakeClock) -> None:
    limiter = make(clock, 6.0, ceiling=8.0, increase=5.0)
    await send_for(limiter, clock, 10.0)
    assert limiter.rate == 8.0
    assert limiter.peak == 8.0
    assert make(clock, 100.0, ceiling=8.0).rate == 8.0  # the initial rate is clamped too


def test_a_lower_ceiling_lowers_the_rate_at_once(clock: FakeClock) -> None:
    limiter = make(clock, 20.0)
    limiter.ceiling = 14.0  # e.g. once SES said its MaxSendRate
    assert (limiter.rate, limiter.ceiling) == (14.0, 14.0)
    limiter.ceiling = None
    assert limiter.rate == 14.0


def test_the_rate_never_falls_below_the_floor(clock: FakeClock) -> None:
    limiter = make(clock, 10.0, floor=2.0)
    for _ in range(10):
        limiter.throttled()
        clock.now += 1.0
    assert limiter.rate == 2.0
    assert make(clock, 0.1, floor=2.0).rate == 2.0


async def test_an_idle_caller_does_not_grow_the_rate(clock: FakeClock) -> None:
    # The caller sends once a second, well under 10/s: success says nothing about 11/s.
    limiter = make(clock, 10.0)
    for _ in range(20):
        async with limiter:
            pass
        clock.now += 1.0
    assert limiter.rate == 10.0
    assert clock.slept == []


async def test_leaving_the_block_feeds_the_law(clock: FakeClock) -> None:
    limiter = make(clock, 8.0, increase=8.0)
    async with limiter:
        pass
    async with limiter:  # paced: found the previous send in the bucket
        pass
    assert limiter.rate == pytest.approx(9.0)
    with pytest.raises(ThrottledError):
        async with limiter:
            raise ThrottledError("Maximum sending rate exceeded.")
    assert limiter.rate == pytest.approx(4.5)
    assert limiter.throttles == 1
    with pytest.raises(PermanentMailError):
        async with limiter:
            raise PermanentMailError("550 no such user")
    assert limiter.rate == pytest.approx(4.5)  # a rejection says nothing about the rate
    assert limiter.throttles == 1


async def test_retry_after_holds_every_send_back(clock: FakeClock) -> None:
    limiter = make(clock, 100.0, max_pause_s=5.0)
    limiter.throttled(retry_after_s=3.0)
    start = clock.now
    async with limiter:
        pass
    assert clock.now - start == pytest.approx(3.0)
    limiter.throttled(retry_after_s=3600.0)  # capped
    start = clock.now
    async with limiter:
        pass
    assert clock.now - start == pytest.approx(5.0)


def test_settled_is_the_recent_time_weighted_mean(clock: FakeClock) -> None:
    limiter = make(clock, 20.0, settle_s=10.0)
    clock.now += 100.0
    assert limiter.settled == pytest.approx(20.0)
    limiter.throttled()  # 10/s from now on
    assert limiter.settled == pytest.approx(20.0)
    clock.now += 10.0  # one time constant: 63% of the way
    assert limiter.settled == pytest.approx(10.0 + 10.0 * 0.3679, abs=0.01)
    clock.now += 100.0
    assert limiter.settled == pytest.approx(10.0, abs=0.01)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0},
        {"initial": float("nan")},
        {"initial": float("inf")},
        {"initial": 5.0, "floor": 0.0},
        {"initial": 5.0, "ceiling": 1.0, "floor": 2.0},
        {"initial": 5.0, "increase": -1.0},
        {"initial": 5.0, "burst": 0.5},
        {"initial": 5.0, "window_s": float("nan")},
    ],
)
def test_unusable_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AdaptiveRate(**kwargs)


# -- pacing -------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.5, 4.0, 20.0, 250.0])
async def test_n_sends_at_rate_r_take_n_over_r_seconds(clock: FakeClock, rate: float) -> None:
    limiter = make(clock, rate, increase=0.0)
    start = clock.now
    for _ in range(100):
        await limiter.acquire()
    # the first send goes at once, the other 99 one interval apart
    assert clock.now - start == pytest.approx(99 / rate)


async def test_a_burst_goes_back_to_back_then_sends_are_paced(clock: FakeClock) -> None:
    limiter = make(clock, 10.0, burst=5.0, increase=0.0)
    start = clock.now
    for _ in range(5):
        await limiter.acquire()
    assert clock.now == start
    for _ in range(10):
        await limiter.acquire()
    assert clock.now - start == pytest.approx(1.0)


def test_concurrent_senders_share_one_pace_in_arrival_order() -> None:
    async def main() -> tuple[float, list[int], list[float]]:
        loop = asyncio.get_running_loop()
        limiter = loop_limiter(50.0, increase=0.0)
        order: list[int] = []
        starts: list[float] = []

        async def sender(index: int) -> None:
            for _ in range(20):
                async with limiter:
                    order.append(index)
                    starts.append(loop.time())
                await asyncio.sleep(0.03)  # the send itself

        start = loop.time()
        await asyncio.gather(*(sender(i) for i in range(10)))
        return loop.time() - start, order, starts

    elapsed, order, starts = run_virtual(main())
    assert len(order) == 200
    assert elapsed == pytest.approx(199 / 50, abs=0.05)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) == pytest.approx(1 / 50)  # never two sends closer than one interval
    assert order[:10] == list(range(10))  # FIFO: first come, first paced


def test_a_rate_change_applies_to_sends_already_waiting() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = loop_limiter(10.0, increase=0.0)
        starts: list[float] = []

        async def sender() -> None:
            async with limiter:
                starts.append(loop.time())

        tasks = [asyncio.create_task(sender()) for _ in range(6)]
        await asyncio.sleep(0.25)  # sends at 0, 0.1, 0.2 went; three wait
        limiter.throttled()  # 5/s from t=0.25 on
        await asyncio.gather(*tasks)
        return starts

    starts = run_virtual(main())
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(starts)]
    # The send at 0.2 had drained half its interval at 10/s by 0.25; the other half takes
    # 0.1 s at 5/s, so the head of the queue, asleep until 0.3, goes at 0.35, not 0.3.
    assert gaps == [0.1, 0.1, 0.15, 0.2, 0.2]


def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        limiter = loop_limiter(1.0, increase=0.0)
        starts: list[float] = []

        async def sender() -> None:
            async with limiter:
                starts.append(loop.time())

        await sender()  # t=0
        doomed = asyncio.create_task(sender())  # would go at t=1
        later = asyncio.create_task(sender())  # would go at t=2
        await asyncio.sleep(0.5)
        doomed.cancel()
        await later
        return starts

    assert run_virtual(main()) == [0.0, pytest.approx(1.0)]


# -- a provider with a hard limit ---------------------------------------------------------


class Provider:
    """A send API that throttles any send that would exceed ``limit`` accepted in 1 s."""

    def __init__(self, limit: int, latency_s: float) -> None:
        self.limit = limit
        self.latency_s = latency_s
        self.recent: deque[float] = deque()  # acceptance times within the last second
        self.accepted: list[tuple[float, int]] = []
        self.refused = 0

    async def send(self, item: int) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.latency_s / 2)  # the request travels
        now = loop.time()
        while self.recent and self.recent[0] <= now - 1.0:
            self.recent.popleft()
        accepted = len(self.recent) < self.limit
        if accepted:
            self.recent.append(now)
            self.accepted.append((now, item))
        else:
            self.refused += 1
        await asyncio.sleep(self.latency_s / 2)  # the reply travels
        if not accepted:
            raise ThrottledError("SES TooManyRequestsException: Maximum sending rate exceeded.")


@pytest.mark.parametrize("initial", [1.0, 200.0], ids=["from-far-below", "from-far-above"])
def test_against_a_hard_limit_nothing_is_lost_and_the_rate_settles_under_it(
    initial: float,
) -> None:
    limit = 20
    duration_s = 60.0

    async def main() -> tuple[Provider, AdaptiveRate, list[int], list[tuple[float, float]]]:
        loop = asyncio.get_running_loop()
        provider = Provider(limit, latency_s=0.05)
        limiter = loop_limiter(initial, increase=1.0)
        items = itertools.count()
        taken: list[int] = []
        samples: list[tuple[float, float]] = []

        async def worker() -> None:
            while loop.time() < duration_s:
                item = next(items)
                taken.append(item)
                while True:  # a throttled send is resent, never dropped
                    try:
                        async with limiter:
                            await provider.send(item)
                    except ThrottledError:
                        continue
                    break

        async def sample() -> None:
            while loop.time() < duration_s:
                samples.append((loop.time(), limiter.rate))
                await asyncio.sleep(0.1)

        await asyncio.gather(sample(), *(worker() for _ in range(8)))
        return provider, limiter, taken, samples

    provider, limiter, taken, samples = run_virtual(main())

    delivered = [item for _, item in provider.accepted]
    assert sorted(delivered) == sorted(taken)  # every send taken was delivered, once
    assert len(set(delivered)) == len(delivered)
    assert provider.refused > 0 and limiter.decreases > 0

    last_half = [rate for t, rate in samples if t >= duration_s - 30]
    mean_rate = statistics.fmean(last_half)
    assert 0.5 * limit <= mean_rate <= limit, mean_rate
    assert max(last_half) <= limit * 1.1  # just under the limit, give or take one step
    assert 0.5 * limit <= limiter.settled <= limit
    throughput = sum(1 for t, _ in provider.accepted if t >= duration_s - 30) / 30
    assert 0.5 * limit <= throughput <= limit, throughput


async def test_a_rate_below_the_default_floor_is_its_own_floor() -> None:
    """--rate 0.4 failed every run ("ceiling 0.4 is below floor 0.5"): it is now honoured."""
    from batchrun.effects.sending import make_limiter

    limiter = await make_limiter(None, 0.4)
    assert limiter is not None and limiter.rate == pytest.approx(0.4)

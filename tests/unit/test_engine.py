"""Unit tests of the bounded-concurrency runner, with in-memory sources and work only."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from typing import Any
from unittest import mock

import pytest

from batchrun.pipeline.engine import (
    Deadline,
    Progress,
    Runner,
    RunResult,
    StopToken,
    install_signal_handlers,
)


class SourceError(Exception):
    """The fake source failed."""


class WorkError(Exception):
    """The fake work failed unexpectedly."""


class Source:
    """An async-generator source of 0..n-1 that records how far it was pulled."""

    def __init__(
        self,
        n: int,
        *,
        slow_fetch_at: int | None = None,
        fail_at: int | None = None,
    ) -> None:
        self.n = n
        self.yielded = 0
        self.closed = False
        self.fetching = False
        self.fetch_cancelled = False
        self.slow_fetch_at = slow_fetch_at
        self.fail_at = fail_at
        # released by the test: the page fetch of item `slow_fetch_at` (or the failure)
        self.fetch_gate = asyncio.Event()
        self.on_yield: Callable[[], None] | None = None
        self.on_fetch: Callable[[int], None] | None = None

    async def items(self) -> AsyncIterator[int]:
        try:
            for i in range(self.n):
                if self.on_fetch is not None:
                    self.on_fetch(i)
                if i in (self.slow_fetch_at, self.fail_at):
                    self.fetching = True
                    try:
                        await self.fetch_gate.wait()
                    except asyncio.CancelledError:
                        self.fetch_cancelled = True
                        raise
                    finally:
                        self.fetching = False
                if i == self.fail_at:
                    raise SourceError(f"page with item {i} failed")
                # a page fetch gives the loop a turn, as a database read would
                await asyncio.sleep(0)
                self.yielded += 1
                if self.on_yield is not None:
                    self.on_yield()
                yield i
        finally:
            self.closed = True


class GatedWork:
    """Work that records each item and blocks until its gate opens."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started: list[int] = []
        self.finished: list[int] = []
        self.cancelled: list[int] = []

    async def __call__(self, item: int) -> None:
        self.started.append(item)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(item)
            raise
        self.finished.append(item)


class MockLoopTime:
    """Virtual loop clock, after aiolimiter's tests: a timer jumps the clock to its deadline.

    ``loop.call_at`` (behind ``asyncio.sleep``, ``call_later`` and aiolimiter's waker) moves
    the clock forward to the requested time and runs the callback on the next loop turn, so
    seconds of waiting take no real time. Timers therefore fire in the order they are set,
    which is only faithful while one timer at a time is pending (a limiter's waker, one
    sleeping watcher): keep ``wait_for`` and other timeouts out of these tests.
    """

    # a real clock always moves on; without this, a timer due "now" after float rounding
    # (aiolimiter computes wake-ups from its level) would spin the loop forever
    resolution = 1e-6

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.now = 0.0
        self._patches = ExitStack()

    def time(self) -> float:
        return self.now

    def call_at(
        self, when: float, callback: Callable[..., object], *args: object, context: Any = None
    ) -> asyncio.Handle:
        self.now = max(self.now + self.resolution, when)
        return self.loop.call_soon(callback, *args, context=context)

    def __enter__(self) -> MockLoopTime:
        self._patches.enter_context(mock.patch.object(self.loop, "time", self.time))
        self._patches.enter_context(mock.patch.object(self.loop, "call_at", self.call_at))
        return self

    def __exit__(self, *_: object) -> None:
        self._patches.close()


@pytest.fixture
def make_runner() -> Iterator[Callable[..., Runner[int]]]:
    """Build runners with test defaults, overridable per test."""

    def make(**overrides: Any) -> Runner[int]:
        options: dict[str, Any] = {"concurrency": 3, "grace_s": 60.0} | overrides
        return Runner(**options)

    yield make


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Collect what the loop's exception handler sees ("Task exception was never retrieved")."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)


async def until(predicate: Callable[[], bool], *, turns: int = 10_000) -> None:
    """Give the loop turns until ``predicate`` holds."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def settle(turns: int = 50) -> None:
    """Give every runnable task a chance to run."""
    for _ in range(turns):
        await asyncio.sleep(0)


def assert_no_tasks_left(loop_errors: list[dict[str, Any]]) -> None:
    """The run left no task behind and no exception unretrieved."""
    assert asyncio.all_tasks() == {asyncio.current_task()}
    gc.collect()
    assert loop_errors == []


async def test_every_item_is_worked_exactly_once(make_runner: Callable[..., Runner[int]]) -> None:
    seen: Counter[int] = Counter()

    async def work(item: int) -> None:
        for _ in range(item % 4):
            await asyncio.sleep(0)
        seen[item] += 1

    for concurrency in (1, 7, 64):
        seen.clear()
        source = Source(500)
        result = await make_runner(concurrency=concurrency).run(source.items(), work)

        assert seen == Counter(range(500)), concurrency
        assert result == RunResult(started=500, finished=500)
        assert source.closed


async def test_in_flight_reaches_concurrency_and_never_exceeds_it(
    make_runner: Callable[..., Runner[int]],
) -> None:
    in_flight = peak = 0

    async def work(item: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        # longer than a fetch, so the pool fills up
        for _ in range(20 + item % 5):
            await asyncio.sleep(0)
        in_flight -= 1

    runner = make_runner(concurrency=8)
    await runner.run(Source(200).items(), work)

    assert peak == 8
    assert runner.max_in_flight == 8
    assert runner.in_flight == 0


async def test_source_is_held_back_by_unfinished_work(
    make_runner: Callable[..., Runner[int]],
) -> None:
    concurrency = 4
    source = Source(300)
    completed = 0
    ahead: list[int] = []
    source.on_yield = lambda: ahead.append(source.yielded - completed)

    async def work(item: int) -> None:
        nonlocal completed
        # slower than a fetch, so the source could run away if nothing held it back
        for _ in range(30):
            await asyncio.sleep(0)
        completed += 1

    await make_runner(concurrency=concurrency).run(source.items(), work)

    # in flight + queued + the one the producer holds
    assert max(ahead) <= 2 * concurrency + 1
    # yet the source does run ahead, filling the queue: its reads overlap the sends
    assert max(ahead) >= 2 * concurrency


async def test_stop_returns_queued_items_and_lets_in_flight_finish(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]]
) -> None:
    runner = make_runner(concurrency=3)
    source = Source(100)
    work = GatedWork()
    task = asyncio.create_task(runner.run(source.items(), work))
    # 0-2 in flight, 3-5 queued, 6 fetched and waiting for room in the queue
    await until(lambda: len(work.started) == 3 and source.yielded == 7)

    runner.stop.request("test stop")
    await settle()
    assert not task.done(), "in-flight items were not waited for"
    assert work.started == [0, 1, 2]
    work.gate.set()
    result = await task

    assert result == RunResult(
        started=3, finished=3, not_started=[3, 4, 5, 6], cancelled=[], stopped_reason="test stop"
    )
    assert sorted(work.finished) == [0, 1, 2]
    assert source.yielded == 7
    assert source.closed
    assert_no_tasks_left(loop_errors)


async def test_stop_while_fetching_keeps_the_fetched_item(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]]
) -> None:
    runner = make_runner(concurrency=2)
    source = Source(100, slow_fetch_at=5)
    done: list[int] = []

    async def work(item: int) -> None:
        done.append(item)

    task = asyncio.create_task(runner.run(source.items(), work))
    await until(lambda: source.fetching and len(done) == 5)
    runner.stop.request("test stop")
    await settle()
    assert not task.done(), "a page fetch in progress is part of the graceful stop"
    source.fetch_gate.set()
    result = await task

    assert not source.fetch_cancelled
    assert done == [0, 1, 2, 3, 4]
    assert result.not_started == [5]
    assert result.stopped_reason == "test stop"
    assert_no_tasks_left(loop_errors)


async def test_stop_wins_over_a_worker_already_woken_for_an_item(
    make_runner: Callable[..., Runner[int]],
) -> None:
    runner = make_runner(concurrency=2)
    source = Source(100)
    done: list[int] = []

    async def work(item: int) -> None:
        done.append(item)

    def stop_at_five(item: int) -> None:
        # item 4 was just queued and an idle worker woken for it, but it has not run yet
        if item == 5:
            runner.stop.request("test stop")

    source.on_fetch = stop_at_five
    result = await runner.run(source.items(), work)

    assert done == [0, 1, 2, 3]
    assert result.not_started == [4, 5]


async def test_stop_before_run_pulls_nothing(make_runner: Callable[..., Runner[int]]) -> None:
    token = StopToken()
    token.request("early")
    source = Source(10)

    result = await make_runner(stop=token).run(source.items(), GatedWork())

    assert result == RunResult(started=0, finished=0, stopped_reason="early")
    assert source.yielded == 0


async def test_stop_after_the_last_item_reports_a_complete_run(
    make_runner: Callable[..., Runner[int]],
) -> None:
    runner = make_runner(concurrency=2)
    work = GatedWork()
    task = asyncio.create_task(runner.run(Source(2).items(), work))
    await until(lambda: len(work.started) == 2)
    runner.stop.request("late")
    work.gate.set()

    assert await task == RunResult(started=2, finished=2)


@pytest.mark.parametrize("how", ["second request", "request_abort"])
async def test_abort_cancels_in_flight_items_and_returns_them(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]], how: str
) -> None:
    runner = make_runner(concurrency=3, grace_s=60.0)
    source = Source(100)
    work = GatedWork()
    task = asyncio.create_task(runner.run(source.items(), work))
    await until(lambda: len(work.started) == 3 and source.yielded == 7)

    runner.stop.request("first")
    await settle()
    assert not task.done()
    assert not runner.stop.aborting
    if how == "second request":
        runner.stop.request("second")
    else:
        runner.stop.request_abort("abort")
    assert runner.stop.aborting
    result = await asyncio.wait_for(task, 5)

    assert result.cancelled == [0, 1, 2]
    assert result.not_started == [3, 4, 5, 6]
    assert (result.started, result.finished) == (3, 0)
    assert result.stopped_reason == "first"
    assert sorted(work.cancelled) == [0, 1, 2]
    assert source.closed
    assert_no_tasks_left(loop_errors)


async def test_grace_expiry_cancels_what_is_still_in_flight(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]]
) -> None:
    runner = make_runner(concurrency=3, grace_s=0.05)
    work = GatedWork()

    async def quick_or_stuck(item: int) -> None:
        if item == 1:
            await asyncio.sleep(0.01)
            return
        await work(item)

    source = Source(100)
    task = asyncio.create_task(runner.run(source.items(), quick_or_stuck))
    await until(lambda: len(work.started) == 2 and runner.in_flight == 3 and source.yielded == 7)
    runner.stop.request("test stop")
    started = time.monotonic()
    result = await asyncio.wait_for(task, 5)

    assert time.monotonic() - started >= 0.04
    assert result.cancelled == [0, 2]
    assert (result.started, result.finished) == (3, 1)
    assert result.not_started == [3, 4, 5, 6]
    assert_no_tasks_left(loop_errors)


async def test_work_error_stops_new_work_and_propagates_after_the_others_finish(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]]
) -> None:
    runner = make_runner(concurrency=3)
    source = Source(100)
    work = GatedWork()
    boom = WorkError("bug")

    async def work_or_fail(item: int) -> None:
        if item == 0:
            await until(lambda: len(work.started) == 2)
            raise boom
        await work(item)

    task = asyncio.create_task(runner.run(source.items(), work_or_fail))
    await until(lambda: len(work.started) == 2)
    await settle()
    assert not task.done(), "in-flight items were not waited for"
    work.gate.set()
    with pytest.raises(WorkError) as raised:
        await task

    assert raised.value is boom
    assert work.started == [1, 2]
    assert sorted(work.finished) == [1, 2]
    assert source.closed
    assert_no_tasks_left(loop_errors)


async def test_source_error_propagates_after_in_flight_finish(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]]
) -> None:
    runner = make_runner(concurrency=3)
    source = Source(100, fail_at=3)
    work = GatedWork()
    task = asyncio.create_task(runner.run(source.items(), work))
    await until(lambda: len(work.started) == 3 and source.fetching)

    source.fetch_gate.set()
    await settle()
    assert not task.done(), "in-flight items were not waited for"
    assert work.started == [0, 1, 2]
    work.gate.set()
    with pytest.raises(SourceError):
        await task

    assert sorted(work.finished) == [0, 1, 2]
    assert_no_tasks_left(loop_errors)


async def test_cancelling_the_run_cancels_everything(
    make_runner: Callable[..., Runner[int]], loop_errors: list[dict[str, Any]]
) -> None:
    source = Source(100)
    work = GatedWork()
    task = asyncio.create_task(make_runner(concurrency=3).run(source.items(), work))
    await until(lambda: len(work.started) == 3)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert sorted(work.cancelled) == [0, 1, 2]
    assert source.closed
    assert_no_tasks_left(loop_errors)


@pytest.mark.parametrize(
    "options",
    [
        {"concurrency": 0},
        {"concurrency": -1},
        {"concurrency": 2, "grace_s": -1},
    ],
)
def test_bad_settings_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Runner(**options)


def test_deadline_expires_at_the_margin() -> None:
    remaining = iter([5000, 1001, 1000, 0])
    deadline = Deadline(lambda: next(remaining), margin_ms=1000)

    assert [deadline.expired() for _ in range(4)] == [False, False, True, True]


async def test_deadline_watch_requests_a_stop_at_the_margin() -> None:
    token = StopToken()

    with MockLoopTime() as clock:
        deadline = Deadline(lambda: int((10.0 - clock.now) * 1000), margin_ms=1000)
        await deadline.watch(token)

    assert token.stopping
    assert not token.aborting
    assert token.reason is not None
    assert token.reason.startswith("deadline")
    assert 9.0 - 1e-6 <= clock.now <= 9.1


async def test_deadline_does_not_escalate_an_earlier_stop() -> None:
    token = StopToken()
    token.request("SIGTERM")

    await Deadline(lambda: 0, margin_ms=500).watch(token)

    assert not token.aborting
    assert token.reason == "SIGTERM"


async def test_deadline_stops_a_run_and_nothing_is_lost(
    make_runner: Callable[..., Runner[int]],
) -> None:
    runner = make_runner(concurrency=2)
    source = Source(1000)
    done: list[int] = []

    async def work(item: int) -> None:
        await asyncio.sleep(0.001)
        done.append(item)

    # "time left" shrinks with work done, so the test does not depend on the machine's speed
    deadline = Deadline(lambda: 5000 - 100 * len(done), margin_ms=1000, poll_s=0.001)
    watch = asyncio.create_task(deadline.watch(runner.stop))
    result = await runner.run(source.items(), work)
    await watch

    assert result.stopped_reason is not None
    assert result.stopped_reason.startswith("deadline")
    assert len(done) >= 40
    assert source.yielded < 1000
    assert sorted([*done, *result.not_started, *result.cancelled]) == list(range(source.yielded))


async def test_signals_stop_then_abort_then_restore_the_old_handlers() -> None:
    loop = asyncio.get_running_loop()
    token = StopToken()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    uninstall = install_signal_handlers(loop, token)
    try:
        # raising the signals below is only safe once they are handled
        for sig, handler in before.items():
            assert signal.getsignal(sig) is not handler
        signal.raise_signal(signal.SIGTERM)
        await until(lambda: token.stopping)
        assert not token.aborting
        assert token.reason == "received SIGTERM"
        signal.raise_signal(signal.SIGINT)
        await until(lambda: token.aborting)
        # after the abort, a third signal goes to the previous handler again
        assert {sig: signal.getsignal(sig) for sig in before} == before
    finally:
        uninstall()
    assert {sig: signal.getsignal(sig) for sig in before} == before


async def test_uninstall_restores_handlers_before_any_signal() -> None:
    before = signal.getsignal(signal.SIGTERM)
    uninstall = install_signal_handlers(asyncio.get_running_loop(), StopToken())
    uninstall()
    uninstall()

    assert signal.getsignal(signal.SIGTERM) == before


async def test_progress_is_forwarded(make_runner: Callable[..., Runner[int]]) -> None:
    events: list[Progress] = []
    runner = make_runner(on_progress=events.append)

    async def work(item: int) -> None:
        runner.progress("skipped" if item % 2 else "done")

    runner.progress("total", 4)
    await runner.run(Source(4).items(), work)

    assert events[0] == Progress("total", 4)
    assert sorted(e.kind for e in events[1:]) == ["done", "done", "skipped", "skipped"]
    make_runner().progress("done")  # no callback: nothing to do


async def test_a_stop_during_the_last_fetch_ends_the_run_at_once() -> None:
    # The source's last fetch (the one that finds no more items) is still running when the
    # work requests a stop: the runner must not then wait to queue its end sentinels into
    # a queue the halted workers no longer read, for the whole grace with nothing in flight.
    stop = StopToken()
    last_fetch = asyncio.Event()
    runner: Runner[int] = Runner(concurrency=2, stop=stop, grace_s=30.0)

    async def source() -> AsyncIterator[int]:
        for item in (1, 2):
            yield item
        await last_fetch.wait()

    async def work(item: int) -> None:
        if item == 1:
            await asyncio.sleep(0.2)  # in flight through the stop: it leaves its sentinel
        else:
            stop.request("mail backend unreachable")
            # the fetch ends once the runner has halted, and finds no more items
            asyncio.get_running_loop().call_later(0.05, last_fetch.set)

    started = time.monotonic()
    result = await asyncio.wait_for(runner.run(source(), work), timeout=20)
    assert time.monotonic() - started < 5, "waited for the grace with nothing in flight"
    assert result.finished == 2 and not result.cancelled and not result.not_started

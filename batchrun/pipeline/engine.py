"""Bounded-concurrency runner: a fixed worker pool, a deadline and graceful stop.

Pacing is not the runner's: each effect holds the run's pacer (batchrun/policy/pacing.py).

One producer task pulls items from the source into a bounded queue and ``concurrency``
worker tasks take them from it, so memory and in-flight work stay bounded whatever the
number of items, and the source's own I/O (one database page at a time) overlaps with the
workers' sends. Every item is at each moment owned by exactly one of: the source, the
producer (fetched, waiting for queue space), the queue, or one worker. A stop therefore
accounts for every item: queued and held ones come back as ``not_started``, in-flight ones
either finish or come back as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, TypeVar

from batchrun.pipeline.stop import Deadline, StopToken, install_signal_handlers

__all__ = [
    "Deadline",
    "Progress",
    "ProgressKind",
    "RunResult",
    "Runner",
    "StopToken",
    "install_signal_handlers",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

ProgressKind = Literal["done", "failed", "skipped", "total"]


@dataclass(frozen=True)
class Progress:
    """One progress event for the UI: ``count`` items became ``kind``."""

    kind: ProgressKind
    count: int = 1


@dataclass
class RunResult(Generic[T]):
    """What a run did; ``stopped_reason`` is None exactly when the source was fully worked."""

    started: int
    finished: int
    not_started: list[T] = field(default_factory=list)
    cancelled: list[T] = field(default_factory=list)
    stopped_reason: str | None = None


class _End(enum.Enum):
    """Queue sentinel: no more items, the worker that takes it exits."""

    END = enum.auto()


_END: Final = _End.END


class _RunState(Generic[T]):
    """Bookkeeping of one ``Runner.run`` call, shared by its producer and workers."""

    __slots__ = (
        "current",
        "exhausted",
        "finished",
        "halted",
        "held",
        "in_source",
        "returned",
        "started",
    )

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        # no new item may start; set by the stop token's callback (before any task runs
        # again) or by the controller on an error
        self.halted = False
        # producer is awaiting the source (a page fetch is not cancelled by a graceful stop)
        self.in_source = False
        self.exhausted = False
        # the item the producer fetched but could not queue (0 or 1 items)
        self.held: list[T] = []
        # items workers took off the queue after the stop, before the controller drained it;
        # they came off the head of the queue, so they precede everything still queued
        self.returned: list[T] = []
        # worker index -> the item it works on; insertion order is start order
        self.current: dict[int, T] = {}

    def halt(self) -> None:
        """Start no new item."""
        self.halted = True


class Runner(Generic[T]):
    """Works items from an async source with bounded concurrency."""

    def __init__(
        self,
        *,
        concurrency: int,
        stop: StopToken | None = None,
        grace_s: float = 30.0,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        """Configure the runner.

        Args:
            concurrency: worker count, the cap on items in flight (at least 1).
            stop: the stop token; a fresh one when None (see ``stop``).
            grace_s: how long in-flight items may take to finish after a stop or an error.
            on_progress: receives the events ``progress`` is given, e.g. for a progress bar.

        Raises:
            ValueError: concurrency below 1, or a negative grace.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not grace_s >= 0:
            raise ValueError(f"grace_s must not be negative, got {grace_s}")
        self._concurrency = concurrency
        self._stop = stop if stop is not None else StopToken()
        self._grace_s = grace_s
        self._on_progress = on_progress
        self._in_flight = 0
        # most items ever in flight at once over this runner's life (for tests and metrics)
        self.max_in_flight = 0
        # the items a run that raised never started (``run`` re-raises; it returns no result)
        self.not_started_on_error: list[T] = []

    @property
    def concurrency(self) -> int:
        """The worker count."""
        return self._concurrency

    @property
    def stop(self) -> StopToken:
        """The token that stops this runner."""
        return self._stop

    @property
    def in_flight(self) -> int:
        """Items being worked on right now."""
        return self._in_flight

    def progress(self, kind: ProgressKind, count: int = 1) -> None:
        """Report progress to ``on_progress``, if any.

        Args:
            kind: what happened to the items (``total`` announces how many there are).
            count: how many items.
        """
        if self._on_progress is not None:
            self._on_progress(Progress(kind, count))

    async def run(
        self, source: AsyncIterator[T], work: Callable[[T], Awaitable[None]]
    ) -> RunResult[T]:
        """Work every item of ``source`` until it is exhausted or the stop token is set.

        ``work`` must handle its own per-item errors. If it raises anyway, or the source
        does, the run stops taking new work, gives in-flight items ``grace_s`` to finish,
        and re-raises the first such exception. The source is closed (``aclose``) when the
        run ends.

        Args:
            source: the items, fetched lazily; at most ``2 * concurrency + 1`` are fetched
                ahead of the finished ones.
            work: the per-item coroutine function.

        Returns:
            Counts, the items left unstarted (in source order) and those cancelled.
        """
        stop = self._stop
        state: _RunState[T] = _RunState()
        queue: asyncio.Queue[T | _End] = asyncio.Queue(maxsize=self._concurrency)
        items = aiter(source)
        producer = asyncio.create_task(self._produce(items, queue, state), name="batchrun-producer")
        workers = [
            asyncio.create_task(
                self._work(index, queue, work, state), name=f"batchrun-worker-{index}"
            )
            for index in range(self._concurrency)
        ]
        tasks = [producer, *workers]
        stopping = asyncio.create_task(stop.wait_stopping())
        aborting: asyncio.Task[None] | None = None
        error: BaseException | None = None
        stop._on_stop.append(state.halt)
        state.halted = stop.stopping
        try:
            error = await self._until_halt(tasks, stopping)
            if any(not task.done() for task in tasks):
                aborting = asyncio.create_task(stop.wait_aborting())
                self._halt(state, queue, producer, workers)
                await self._grace(tasks, aborting)
                error = self._first_error(tasks, error)
        finally:
            stop._on_stop.remove(state.halt)
            await self._cleanup([*tasks, stopping, *([aborting] if aborting else [])])
            # an async generator source releases what it holds (a cursor, a connection) now,
            # not whenever it is garbage collected
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()
        not_started = [*state.returned, *state.held]
        if error is not None:
            self.not_started_on_error = not_started  # never started: the caller may free them
            raise error
        cancelled = list(state.current.values())
        complete = state.exhausted and not not_started and not cancelled
        return RunResult(
            started=state.started,
            finished=state.finished,
            not_started=not_started,
            cancelled=cancelled,
            stopped_reason=None if complete else stop.reason,
        )

    async def _produce(
        self, items: AsyncIterator[T], queue: asyncio.Queue[T | _End], state: _RunState[T]
    ) -> None:
        """Feed the queue from the source; a full queue holds the source back."""
        while not state.halted:
            state.in_source = True
            try:
                item = await anext(items)
            except StopAsyncIteration:
                state.exhausted = True
                break
            finally:
                state.in_source = False
            if state.halted:
                state.held.append(item)
                return
            # put_nowait when there is room skips a coroutine per item (hot path)
            if queue.full():
                try:
                    await queue.put(item)
                except asyncio.CancelledError:
                    state.held.append(item)
                    raise
            else:
                queue.put_nowait(item)
        else:
            return
        for _ in range(self._concurrency):
            if state.halted:
                # A stop came while the last fetch ran: _halt has already queued one
                # sentinel per live worker, and a busy worker leaves its own unread, so
                # the queue may stay full for good; waiting to put more would hold the
                # run for the whole grace with nothing in flight.
                return
            await queue.put(_END)

    async def _work(
        self,
        index: int,
        queue: asyncio.Queue[T | _End],
        work: Callable[[T], Awaitable[None]],
        state: _RunState[T],
    ) -> None:
        """Work queued items one at a time until the end sentinel or a stop."""
        current = state.current
        while not state.halted:
            item = queue.get_nowait() if queue.qsize() else await queue.get()
            if item is _END:
                return
            if state.halted:
                state.returned.append(item)
                return
            state.started += 1
            current[index] = item
            self._in_flight += 1
            if self._in_flight > self.max_in_flight:
                self.max_in_flight = self._in_flight
            try:
                await work(item)
            except asyncio.CancelledError:
                # the item stays in `current`: the run reports it as cancelled
                raise
            except BaseException:
                del current[index]
                raise
            finally:
                self._in_flight -= 1
            del current[index]
            state.finished += 1

    async def _until_halt(
        self, tasks: list[asyncio.Task[None]], stopping: asyncio.Task[None]
    ) -> BaseException | None:
        """Wait until all tasks end, one fails (return its error) or a stop is requested."""
        pending: set[asyncio.Task[None]] = {*tasks, stopping}
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping and (error := _failure(task)) is not None:
                    return error
            if stopping in done or pending == {stopping}:
                return None

    def _halt(
        self,
        state: _RunState[T],
        queue: asyncio.Queue[T | _End],
        producer: asyncio.Task[None],
        workers: list[asyncio.Task[None]],
    ) -> None:
        """Stop taking new work: take back queued items and release idle workers."""
        state.halted = True
        # a page fetch in progress may finish within the grace (its item is then held);
        # a producer waiting for queue space is cancelled before the drain can wake it
        if not state.in_source:
            producer.cancel()
        while not queue.empty():
            item = queue.get_nowait()
            if item is not _END:
                state.returned.append(item)
        # the queue is empty and holds `concurrency` slots, so this never blocks; busy
        # workers exit after their item and leave their sentinel unread
        for worker in workers:
            if not worker.done():
                queue.put_nowait(_END)

    async def _grace(self, tasks: list[asyncio.Task[None]], aborting: asyncio.Task[None]) -> None:
        """Let running tasks end within the grace period, then cancel the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace_s
        running = [task for task in tasks if not task.done()]
        while running and not self._stop.aborting:
            timeout = deadline - loop.time()
            if timeout <= 0:
                break
            await asyncio.wait(
                [*running, aborting], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            running = [task for task in running if not task.done()]
        if running:
            why = "abort" if self._stop.aborting else f"grace of {self._grace_s:g} s expired"
            logger.warning("%s: cancelling %d in-flight items", why, self._in_flight)
            for task in running:
                task.cancel()
            await asyncio.wait(running)

    def _first_error(
        self, tasks: list[asyncio.Task[None]], error: BaseException | None
    ) -> BaseException | None:
        """Return the first error of the run; log the ones that came after it."""
        for task in tasks:
            later = _failure(task) if task.done() and not task.cancelled() else None
            if later is None or later is error:
                continue
            if error is None:
                error = later
            else:
                logger.error("also failed in %s", task.get_name(), exc_info=later)
        return error

    async def _cleanup(self, tasks: list[asyncio.Task[None]]) -> None:
        """Leave no task pending and no exception unretrieved, even if the run is cancelled."""
        running = [task for task in tasks if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
        for task in tasks:
            if not task.cancelled():
                task.exception()


def _failure(task: asyncio.Task[None]) -> BaseException | None:
    """The exception a finished task ended with; a task nobody cancelled counts as failed."""
    if task.cancelled():
        return RuntimeError(f"{task.get_name()} was cancelled by its own work")
    return task.exception()

"""The two loops over a queue: a drain that works what is there once (`batchrun retry`)
and a worker that consumes until stopped (`batchrun worker`). Each hands received
messages to the one ``Consumer`` (``drain.work_batch``); between batches they do the
chores a consumer owes the queue (``Chores``) and back off a mail outage."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from batchrun.control.steering import Steering
from batchrun.effects.backends import BackendPool
from batchrun.pipeline.consume import Consumer
from batchrun.pipeline.drain import work_batch
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.reports import RetrySummary
from batchrun.pipeline.run import Options
from batchrun.queue.base import Received, WorkQueue

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.5  # a worker's pause between empty receives (SQS long-polls on top)
OUTAGE_BACKOFF_S = (1.0, 30.0)  # a worker's pause after the mail backend was unreachable
REQUEUE_EVERY_S = 60.0  # how often a worker re-sends failures the queue did not take


@dataclass(frozen=True)
class Chores:
    """What a consumer does besides working messages, each counted in ``requeued``:
    queue the failures a run could not queue, and, on an empty queue, send again the
    submitted tasks whose message was lost."""

    requeue_unqueued: Callable[[], Awaitable[int]]
    resend_lost_tasks: Callable[[WorkQueue], Awaitable[int]]
    read_controls: Callable[[], Awaitable[None]]  # pause and cancel (``Steering.refresh``)


@dataclass(frozen=True)
class QueueLoop:
    """One queue and what consuming it needs: the consumer (its breaker and bug streak
    span batches), the backends whose figures the summary reports, the chores, the stop."""

    consumer: Consumer
    queue: WorkQueue
    backends: BackendPool
    chores: Chores
    stop: StopToken
    steering: Steering

    async def drain(
        self,
        options: Options,
        result: RetrySummary,
        *,
        max_messages: int,
        visibility_s: float,
    ) -> RetrySummary:
        """Work what the queue holds once, up to ``max_messages``: delete successes, back
        off the rest; counted into ``result``. A mail outage ends it (the rest waits for a
        later drain, instead of burning its attempts against a backend that is down).

        A drain is a run going on: `batchrun cancel` of a job, given while it works that
        job's messages, stops it as Ctrl-C would (read before each batch, and at the
        batch's heartbeats), the rest left on the queue."""
        async with self._steered(result):
            result.requeued += await self.chores.requeue_unqueued()
            received = 0
            while received < max_messages and not self.stop.stopping:
                await self.chores.read_controls()
                if self.stop.stopping:
                    break  # cancelled
                want = min(max(options.concurrency, 10), max_messages - received)
                items = await self._receive_up_to(want, visibility_s)
                if not items:
                    result.requeued += (resent := await self.chores.resend_lost_tasks(self.queue))
                    if not resent:
                        break
                    continue  # to work what was sent again
                received += len(items)
                broken = await work_batch(
                    self.consumer, self.queue, items, options, result, visibility_s
                )
                if self.consumer.bugs.tripped is not None:
                    result.error = self.consumer.bugs.tripped
                    break
                if broken:
                    why = self.consumer.breaker.reason or "mail backend unreachable"
                    log.error("%s: the drain stops; run `batchrun retry` later", why)
                    break
        return result

    async def serve(
        self,
        options: Options,
        result: RetrySummary,
        *,
        prefetch: int,
        visibility_s: float,
        idle_exit_s: float | None,
    ) -> RetrySummary:
        """Consume until stopped, or idle for ``idle_exit_s`` (see ``Runtime.serve``). A mail
        outage pauses it (1 s, doubling to 30 s), then lets one call through. `batchrun
        cancel` of a job, given while it works that job's messages, stops it as SIGTERM
        would (the run record's heartbeat reads it)."""
        async with self._steered(result):
            idle_since, requeued_at, outage = time.monotonic(), 0.0, 0
            while not self.stop.stopping:
                if time.monotonic() - requeued_at >= REQUEUE_EVERY_S:
                    result.requeued += await self.chores.requeue_unqueued()
                    requeued_at = time.monotonic()
                items = await self.queue.receive(max_messages=prefetch, visibility_s=visibility_s)
                if not items:
                    # Nothing to give: a lost task nothing waits behind can be told (drain.py).
                    if resent := await self.chores.resend_lost_tasks(self.queue):
                        result.requeued += resent
                        idle_since = time.monotonic()  # not idle: it works what it sent
                        continue
                    # Idle: nothing received for idle_exit_s, and no task this worker put back
                    # to wait for its entity's turn is still to come back.
                    now = time.monotonic()
                    if (
                        idle_exit_s is not None
                        and now - idle_since >= idle_exit_s
                        and now >= result.waiting_until
                    ):
                        break
                    await self.sleep(IDLE_POLL_S)
                    continue
                known, paused = set(result.unknown_jobs), result.paused
                broken = await work_batch(
                    self.consumer, self.queue, items, options, result, visibility_s
                )
                if result.paused - paused < len(items):  # a paused job's messages are no work
                    idle_since = time.monotonic()
                if self.consumer.bugs.tripped is not None:
                    result.error = self.consumer.bugs.tripped  # like a crash: exit 1
                    break
                for name in sorted(result.unknown_jobs - known):
                    log.warning(
                        "messages for job %r, which this worker does not know, stay on the queue: "
                        "give its module with --jobs",
                        name,
                    )
                if broken:
                    pause = min(OUTAGE_BACKOFF_S[1], OUTAGE_BACKOFF_S[0] * 2**outage)
                    outage += 1
                    why = self.consumer.breaker.reason or "mail backend unreachable"
                    log.warning("%s: the worker pauses %.0f s", why, pause)
                    await self.sleep(pause)
                    self.consumer.breaker.half_open()
                    self.backends.half_open()
                else:
                    outage = 0
        return result

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the stop comes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait_stopping(), timeout=seconds)

    async def _receive_up_to(self, want: int, visibility_s: float) -> list[Received]:
        items: list[Received] = []
        while len(items) < want:
            got = await self.queue.receive(
                max_messages=min(10, want - len(items)), visibility_s=visibility_s
            )
            if not got:
                break
            items.extend(got)
        return items

    @contextlib.asynccontextmanager
    async def _steered(self, result: RetrySummary) -> AsyncIterator[None]:
        """A loop's life: a cancel of a job it works stops it; at its end, the queue's
        depth, the backends' figures for the loop and why it stopped, into ``result``."""
        backends = self.backends.snapshot()
        done = self.steering.steer(self.stop, scopes=self.consumer.working)
        try:
            yield
        finally:
            done()
        result.remaining, _ = await self.queue.depths()
        result.backends = self.backends.figures(since=backends)
        result.stopped = self.stop.reason if self.stop.stopping else None

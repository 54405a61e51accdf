"""The sweep of an empty queue: lost tasks that nothing waits behind, sent again.

``tasks/resend.py`` sends a lost task's message again when its key is submitted again or
when a consumer's messages wait behind it. A task that nothing waits behind (its entity's
only one, or any task of a job with ``serial = "none"``) is found only here, by a
consumer that finds its queue empty: a ``worker`` whose receive comes back empty, a
``retry`` drain at its end, the SQS-triggered Lambda when the queue holds nothing but its
batch. Only then: in a backlog every task older than ``after_s`` would look lost and get
a twin. A paused job is left out by the caller (its messages wait on the queue, hidden,
so the queue looks empty).

Each sweep of a job reads a slice of ``SLICE`` never-started tasks in id order, from
where the same process's previous one stopped (back to the start after the last), so in
a long-lived worker a long run of tasks that only wait for their turn cannot hide a lost
one behind it (a new process starts from the oldest); at most every min(60,
``after_s`` / 5) s per process, queue and job. A stop (SIGTERM, the Lambda's
deadline) ends it between sends; its own failure is logged, never raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from batchrun.pipeline.engine import StopToken
from batchrun.queue.base import WorkQueue
from batchrun.tasks.resend import send_again
from batchrun.tasks.store import TaskStore

log = logging.getLogger(__name__)
SLICE = 500  # never-started tasks a sweep of a job reads
SEND_BATCH = 10  # messages a send (SQS's SendMessageBatch limit)
# By (queue, job), for the consumers a process makes one after another: the monotonic
# time of the last sweep, and the id it stopped after.
_SWEPT: dict[tuple[str, str], float] = {}
_CURSOR: dict[tuple[str, str], int] = {}


async def sweep_idle(
    store: TaskStore,
    queue: WorkQueue,
    jobs: Mapping[str, bool],
    *,
    after_s: float,
    stop: StopToken | None = None,
    empty: Callable[[], Awaitable[bool]] | None = None,
) -> int:
    """Send again what looks lost among ``jobs``' never-started tasks (name -> whether its
    tasks run one at a time per entity), for the jobs due a sweep; the number sent.
    ``empty``: asked once a job is due, when the caller does not know the queue is empty."""
    clock = time.monotonic()
    due = {
        job: serial
        for job, serial in jobs.items()
        if clock - _SWEPT.get((queue.url, job), -1e9) >= min(60.0, after_s / 5)
    }
    for job in due:
        _SWEPT[(queue.url, job)] = clock
    try:
        if not due or (empty is not None and not await empty()):
            return 0
    except Exception as exc:  # a look-out: whatever else the caller does stands
        log.warning("looking for lost tasks failed: %s", exc)
        return 0
    sent = 0
    for job, serial in due.items():
        try:
            sent += await _sweep(store, queue, job, serial, after_s, stop)
        except Exception as exc:  # this job's look; the others' still go
            log.warning("looking for lost %s tasks failed: %s", job, exc)
    return sent


async def _sweep(
    store: TaskStore,
    queue: WorkQueue,
    job: str,
    serial: bool,
    after_s: float,
    stop: StopToken | None,
) -> int:
    where = (queue.url, job)
    now = await store.db.clock_ms()
    cutoff = now - int(after_s * 1000)
    read, last, found = await store.unstarted_slice(job, _CURSOR.get(where, 0), cutoff, SLICE)
    _CURSOR[where] = last if read >= SLICE else 0  # the end of the table: round again
    if serial and found:  # only a task whose entity's turn it is
        firsts = await store.lost_firsts(job, sorted({entity for entity, _ in found}), cutoff)
        found = sorted(firsts.items())
    sent = 0
    claimed: list[tuple[int, str]] = []
    try:
        for at, (entity, key) in enumerate(found, start=1):
            if stop is not None and stop.stopping:
                break
            if await store.claim_resend(job, key, now, cutoff):
                claimed.append((entity, key))
            if claimed and (len(claimed) == SEND_BATCH or at == len(found)):
                sent += await _send(store, queue, job, claimed, now)
                claimed = []
    finally:  # stopped, or a claim failed: what is claimed is sent (else held a period)
        if claimed:
            sent += await _send(store, queue, job, claimed, now)
    return sent


async def _send(
    store: TaskStore, queue: WorkQueue, job: str, tasks: list[tuple[int, str]], now: int
) -> int:
    await send_again(store, queue, job, tasks, now)
    for _, key in tasks:
        log.warning(
            "task %r of job %r was submitted but never started, and the queue is empty: "
            "its message is sent again",
            key,
            job,
        )
    return len(tasks)

"""A submitted task whose message was lost, sent again.

``submit`` writes the task's row, then sends its message. A process that dies between the
two leaves a row no message names: the task would never run, and the entity's later tasks
(one at a time, in submission order) would wait behind it for ever. Such a row is known
by its look: pending, never started, submitted more than ``BATCHRUN_TASK_RESEND_S`` ago
and not sent again since; for a job whose tasks run one at a time per entity, also its
entity's oldest unfinished task since longer than that (its own message, until then,
waits its turn: hidden at most 1.5 x ``TURN_WAIT_MAX_S`` at a time). Two things send its
message again: the same key submitted again, and a consumer whose messages wait behind
it. ``resent_at``, set by a compare-and-set, makes one process the sender each period,
however many wait behind it.

A message that was only slow (a deep queue) gets a twin. That is harmless: the row runs
once, and the twin finds it done (deleted) or running (it waits its turn). The age is
told on the database's clock from ``created_at``, which the submitter's clock wrote: a
submitter whose clock is minutes off makes its lost tasks look lost that much sooner
(a twin more) or later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from batchrun.queue.base import QueueMessage, WorkQueue
from batchrun.tasks.store import TaskStore

log = logging.getLogger(__name__)
# (queue, job) -> monotonic time of a consumer's last look in this process: shared by
# the consumers a process makes one after another (a warm Lambda makes one an invocation)
_LOOKED: dict[tuple[str, str], float] = {}


async def resend_if_lost(
    store: TaskStore,
    queue: WorkQueue,
    job: str,
    entity_id: int,
    key: str,
    *,
    after_s: float,
    serial: bool,
) -> bool:
    """Send ``key``'s message again if its task looks lost; whether this call sent it.
    ``serial``: its job runs one task at a time per entity (``Task.serial == "entity"``)."""
    now = await store.db.clock_ms()
    cutoff = now - int(after_s * 1000)
    if serial and (await store.lost_firsts(job, [entity_id], cutoff)).get(entity_id) != key:
        return False  # it waits its turn: its message, if any, comes back then
    if not await store.claim_resend(job, key, now, cutoff):
        return False
    await _send(store, queue, job, entity_id, key, now)
    log.info("task %r of job %r, submitted again, was never started: sent again", key, job)
    return True


class LostTaskSweep:
    """A consumer's look, at most once per ``every_s`` in a process, at what its waiting
    messages wait behind: each entity's oldest unfinished task, sent again if it looks
    lost. Its own failure is logged, never the batch's: the batch's work is done."""

    def __init__(self, store: TaskStore, queue: WorkQueue, *, after_s: float) -> None:
        self.store = store
        self.queue = queue
        self.after_s = after_s
        self.every_s = min(60.0, after_s / 5)

    async def behind(self, job: str, entities: Iterable[int], present: set[str]) -> int:
        """Look at the entities whose messages wait (``present``: the keys whose messages
        this batch holds, never lost); the number of messages sent again."""
        waiting = sorted(set(entities))
        clock, looked = time.monotonic(), (self.queue.url, job)
        last = _LOOKED.get(looked)
        if not waiting or (last is not None and clock - last < self.every_s):
            return 0
        _LOOKED[looked] = clock
        sent = 0
        try:
            now = await self.store.db.clock_ms()
            cutoff = now - int(self.after_s * 1000)
            for entity, key in (await self.store.lost_firsts(job, waiting, cutoff)).items():
                if key in present or not await self.store.claim_resend(job, key, now, cutoff):
                    continue
                await _send(self.store, self.queue, job, entity, key, now)
                log.warning(
                    "task %r of job %r was submitted but never started: its message is sent again",
                    key,
                    job,
                )
                sent += 1
        except Exception as exc:  # a look-out: the batch's outcomes stand
            log.warning("looking for lost %s tasks failed: %s", job, exc)
        return sent


async def _send(
    store: TaskStore, queue: WorkQueue, job: str, entity_id: int, key: str, claimed_at: int
) -> None:
    """Send the message again; if it cannot be, undo the claim so the next look retries."""
    message = QueueMessage("entity_task", job, "", entity_id=entity_id, key=key, resent=True)
    try:
        await queue.send([message.to_json()])
    except BaseException:
        try:
            await store.unclaim_resend(job, key, claimed_at)
        except Exception as exc:  # the send's error is the one to report
            log.warning("task %r of job %r: its resend not undone: %s", key, job, exc)
        raise

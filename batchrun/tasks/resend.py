"""A submitted task whose message was lost, sent again.

``submit`` writes the task's row, then sends its message. A process that dies between the
two leaves a row no message names: the task would never run, and the entity's later tasks
(one at a time, in submission order) would wait behind it for ever. Such a row is known
by its look: pending, never started, submitted more than ``BATCHRUN_TASK_RESEND_S`` ago
and not sent again since. Two things send its message again: the same key submitted
again, and a consumer whose messages wait behind it. ``resent_at``, set by a
compare-and-set, makes one process the sender each period, however many wait behind it.

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

from batchrun.errors import QueueError
from batchrun.queue.base import QueueMessage, WorkQueue
from batchrun.tasks.store import TaskStore

log = logging.getLogger(__name__)


async def resend_if_lost(
    store: TaskStore, queue: WorkQueue, job: str, entity_id: int, key: str, after_s: float
) -> bool:
    """Send ``key``'s message again if its task looks lost; whether this call sent it."""
    now = await store.db.clock_ms()
    if not await store.claim_resend(job, key, now, now - int(after_s * 1000)):
        return False
    await _send(queue, job, entity_id, key)
    log.info("task %r of job %r, submitted again, was never started: sent again", key, job)
    return True


class LostTaskSweep:
    """A consumer's look, at most once per ``every_s``, at what its waiting messages wait
    behind: each entity's oldest unfinished task, sent again if it looks lost."""

    def __init__(self, store: TaskStore, queue: WorkQueue, *, after_s: float) -> None:
        self.store = store
        self.queue = queue
        self.after_s = after_s
        self.every_s = min(60.0, after_s / 5)
        self._last: dict[str, float] = {}  # job -> monotonic time of its last look

    async def behind(self, job: str, entities: Iterable[int], present: set[str]) -> int:
        """Look at the entities whose messages wait (``present``: the keys whose messages
        this batch holds, never lost); the number of messages sent again."""
        waiting = sorted(set(entities))
        clock = time.monotonic()
        if not waiting or clock - self._last.get(job, -self.every_s) < self.every_s:
            return 0
        self._last[job] = clock
        now = await self.store.db.clock_ms()
        cutoff = now - int(self.after_s * 1000)
        sent = 0
        for entity, key in (await self.store.lost_firsts(job, waiting, cutoff)).items():
            if key in present or not await self.store.claim_resend(job, key, now, cutoff):
                continue
            try:
                await _send(self.queue, job, entity, key)
            except QueueError as exc:  # the batch's own work goes on; looked at next period
                log.warning("task %r of job %r looks lost, not sent again: %s", key, job, exc)
                continue
            log.warning(
                "task %r of job %r was submitted but never started: its message is sent again",
                key,
                job,
            )
            sent += 1
        return sent


async def _send(queue: WorkQueue, job: str, entity_id: int, key: str) -> None:
    message = QueueMessage("entity_task", job, "", entity_id=entity_id, key=key, resent=True)
    await queue.send([message.to_json()])

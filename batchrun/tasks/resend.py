"""A submitted task whose message was lost, sent again.

``submit`` writes the task's row, then sends its message. A process that dies between the
two leaves a row no message names: the task would never run, and the entity's later tasks
(one at a time, in submission order) would wait behind it for ever. Such a row is known
by its look: pending, never started, submitted more than ``BATCHRUN_TASK_RESEND_S`` ago
and not sent again since; for a job whose tasks run one at a time per entity, also its
entity's oldest unfinished task since longer than that (its own message, until then,
waits its turn: hidden until the batch that held it ends, then 1.5 x ``TURN_WAIT_MAX_S``
at most). Three things send its message again: the same key submitted again, a consumer
whose messages wait behind it, and, for a task nothing waits behind (its entity's only
one, or any of a job with ``serial = "none"``), a consumer that finds the queue empty
(``tasks/sweep.py``). ``resent_at``, set by a compare-and-set, makes one process the
sender each period, however many look.

A message that was only slow (a deep queue, or a batch that ran a long task) gets a
twin. The row still runs once, and the twin finds it done (deleted) or running (it waits
its turn); should the task fail, the twin waits for its retry time (``retry_at``) as a
duplicate delivery by SQS does. The age is told on the database's clock, from a
``created_at`` written on it too (``db/clock.py``): a submitter whose clock is minutes off
makes its tasks look lost neither sooner nor later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from batchrun.chunks import chunks
from batchrun.queue.base import QueueMessage, WorkQueue
from batchrun.tasks.store import TaskStore

log = logging.getLogger(__name__)
# By (queue, job), shared by the consumers a process makes one after another (a warm
# Lambda makes one an invocation): the monotonic time of the last look, and the entities
# seen waiting since, looked at next time (at most WAITING_MAX, the oldest kept).
_LOOKED: dict[tuple[str, str], float] = {}
_WAITING: dict[tuple[str, str], set[int]] = {}
WAITING_MAX = 10_000
LOOK_CHUNK = 500  # entities a query


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
    lost. Entities seen waiting between two looks are all looked at by the second. Its
    own failure is logged, never the batch's: the batch's work is done."""

    def __init__(self, store: TaskStore, queue: WorkQueue, *, after_s: float) -> None:
        self.store = store
        self.queue = queue
        self.after_s = after_s
        self.every_s = min(60.0, after_s / 5)
        self.sent = 0  # messages sent again, for the consumer's ``requeued``

    async def behind(self, job: str, entities: Iterable[int], present: set[str]) -> int:
        """Note the entities whose messages wait, and look at those noted so far if it is
        time (``present``: the keys whose messages this batch holds, never lost); the
        number of messages sent again."""
        looked = (self.queue.url, job)
        seen = _WAITING.setdefault(looked, set())
        for entity in entities:
            if len(seen) >= WAITING_MAX:
                break
            seen.add(entity)
        clock, last = time.monotonic(), _LOOKED.get(looked)
        if not seen or (last is not None and clock - last < self.every_s):
            return 0
        _LOOKED[looked] = clock
        waiting = sorted(seen)
        seen.clear()
        sent = 0
        try:
            now = await self.store.db.clock_ms()
            cutoff = now - int(self.after_s * 1000)
            lost: dict[int, str] = {}
            for some in chunks(waiting, LOOK_CHUNK):
                lost |= await self.store.lost_firsts(job, some, cutoff)
            for entity, key in lost.items():
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
        self.sent += sent
        return sent


async def _send(
    store: TaskStore, queue: WorkQueue, job: str, entity_id: int, key: str, claimed_at: int
) -> None:
    """Send the message again; if it cannot be, undo the claim so the next look retries."""
    await send_again(store, queue, job, [(entity_id, key)], claimed_at)


async def send_again(
    store: TaskStore,
    queue: WorkQueue,
    job: str,
    tasks: Sequence[tuple[int, str]],
    claimed_at: int,
) -> None:
    """Send the messages of ``tasks`` (entity, key) again, claimed at ``claimed_at``, in
    one call; if the queue refuses them, undo every claim so the next look retries."""
    bodies = [
        QueueMessage("entity_task", job, "", entity_id=entity, key=key, resent=True).to_json()
        for entity, key in tasks
    ]
    try:
        await queue.send(bodies)
    except BaseException:
        for _, key in tasks:
            try:
                await store.unclaim_resend(job, key, claimed_at)
            except Exception as exc:  # the send's error is the one to report
                log.warning("task %r of job %r: its resend not undone: %s", key, job, exc)
        raise

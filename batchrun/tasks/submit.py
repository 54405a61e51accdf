"""Queue submitted tasks: checked, recorded once per (job, key), then sent."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchrun.chunks import chunks
from batchrun.db.base import Database
from batchrun.errors import QueueError
from batchrun.job import Job
from batchrun.queue.base import QueueMessage, WorkQueue
from batchrun.task import BadTask, Task, checked
from batchrun.tasks.resend import resend_if_lost
from batchrun.tasks.store import Submission, TaskStore

log = logging.getLogger(__name__)

SEND_BATCH = 10  # messages a queue call (SQS's SendMessageBatch takes ten)
KEYS_A_LOOKUP = 500  # keys one statement looks up


@dataclass(frozen=True, slots=True)
class Submitted:
    job: str
    entity_id: int
    key: str
    queued: bool  # False: the key was submitted before, nothing changed
    resent: bool = False  # the key was submitted before; its message looked lost: sent again

    def as_json(self) -> dict[str, object]:
        return {
            "job": self.job,
            "entity_id": self.entity_id,
            "key": self.key,
            "queued": self.queued,
        }


def task_job(jobs: dict[str, Job], name: str) -> Task:
    """The Task job ``name``, or BadTask saying why not."""
    job = jobs.get(name)
    if job is None:
        raise BadTask(f"unknown job {name!r} (known: {', '.join(sorted(jobs)) or 'none'})")
    if not isinstance(job, Task):
        raise BadTask(f"job {name!r} is not a task job: give --period to re-run an entity")
    return job


async def submit(
    db: Database,
    queue: WorkQueue,
    job: Task,
    entity_id: object,
    data: object = None,
    key: object = None,
    *,
    resend_after_s: float,
) -> Submitted:
    """Record and queue one task; a key already submitted is a no-op (``queued`` False),
    unless its message looks lost: never started ``resend_after_s``
    (``BATCHRUN_TASK_RESEND_S``) after it was submitted, it is sent again (``queued``
    True; ``tasks/resend.py``).

    Everything is checked before anything is written (BadTask). The row is written first,
    then the message. A send that fails takes the row back (the caller sees the
    QueueError), so a resubmission of the same key queues it: a row left without its
    message would never run, and would hold up the entity's later tasks behind it. Only a
    crash between the two, or a database that fails the withdrawal too, leaves one."""
    [done] = await submit_many(
        db, queue, job, [(entity_id, data, key)], resend_after_s=resend_after_s
    )
    return done


async def submit_many(
    db: Database,
    queue: WorkQueue,
    job: Task,
    tasks: Sequence[tuple[object, object, object]],
    *,
    resend_after_s: float,
    on_sent: Callable[[list[Submitted]], None] | None = None,
) -> list[Submitted]:
    """``submit`` for many tasks of one job, each ``(entity_id, data, key)``: what each
    became, in order. One statement a task and one queue call per ``SEND_BATCH`` tasks,
    where ``submit`` one by one makes two statements and a queue call each. A key
    submitted before is a no-op for its statement alone unless its message could look lost
    (``_settled``: one clock read per call of keys never started).

    All are checked before anything is written (BadTask), a key given for another entity
    before (or twice in the list, for two) included. Then ``SEND_BATCH`` at a time, in
    submission order: their rows, then their messages in one queue call. On an error the
    rows of that call whose message the queue did not take are taken back (all of them,
    unless the queue tells which it took: ``QueueError.unsent``) and the error is raised;
    what earlier calls queued stays queued. Submitting the same tasks again then queues
    what was not, and is a no-op for what was (their keys must be given for that).
    ``on_sent`` is told what each call settled, as it goes; on an error, what stays of the
    failed call too (what the queue took of it, keys submitted before), so that what it
    was told is what stays queued."""
    items = [checked(*task) for task in tasks]
    store = TaskStore(db)
    # One task is checked by its own insert, as it always was.
    known = await _refuse_other_entities(store, job.name, items) if len(items) > 1 else {}
    await store.add_turns(job.name, list(dict.fromkeys(entity for entity, _, _ in items)))
    done: list[Submitted] = []
    for batch in chunks(items, SEND_BATCH):
        done += await _submit_batch(store, queue, job, batch, known, resend_after_s, on_sent)
    return done


async def _refuse_other_entities(
    store: TaskStore, job: str, items: list[tuple[int, str, str]]
) -> dict[str, Submission]:
    """BadTask for a key given for two entities in ``items``, or submitted before for
    another entity: before anything is written or sent. The keys submitted before (for
    the same entity), with what their rows tell."""
    entity_of: dict[str, int] = {}
    for entity, _, key in items:
        if entity_of.setdefault(key, entity) != entity:
            raise BadTask(
                f"task key {key!r} is given for entities {entity_of[key]} and {entity}", key=key
            )
    keys = list(entity_of)
    known: dict[str, Submission] = {}
    for some in chunks(keys, KEYS_A_LOOKUP):
        found = await store.submitted_many(job, some)
        for key, row in found.items():
            if row.entity_id != entity_of[key]:
                raise BadTask(f"task key {key!r} was submitted for entity {row.entity_id}", key=key)
        known.update(found)
    return known


async def _settled(
    store: TaskStore,
    items: list[tuple[int, str, str]],
    known: dict[str, Submission],
    resend_after_s: float,
) -> set[str]:
    """The keys of ``items`` submitted before whose message cannot look lost now
    (``Submission.settled``): a resubmission of one is a no-op without the three
    statements of ``resend_if_lost``. One clock read for the batch, none when every such
    key started once.

    The rows were read before the batch. Since then a row can only have started, which
    leaves it settled, or have gone (withdrawn, pruned), when the batch's insert adds it
    anew. One that comes to look lost during the batch is left for the next look, as if
    the batch had been a few milliseconds sooner."""
    ours = [key for _, _, key in items if key in known]
    if all(not known[key].unstarted for key in ours):
        return set(ours)
    cutoff = await store.db.clock_ms() - int(resend_after_s * 1000)
    return {key for key in ours if known[key].settled(cutoff)}


async def _submit_batch(
    store: TaskStore,
    queue: WorkQueue,
    job: Task,
    items: list[tuple[int, str, str]],
    known: dict[str, Submission],
    resend_after_s: float,
    on_sent: Callable[[list[Submitted]], None] | None,
) -> list[Submitted]:
    """Up to ``SEND_BATCH`` tasks: their rows, then the new ones' messages in one call.
    ``known``: keys found submitted before for the same entity (not looked up again).
    ``on_sent`` is told what the call settled; on an error, what stays (not taken back)."""
    done: list[Submitted] = []
    unsent: list[Submitted] = []  # recorded here, their messages not yet sent
    try:
        settled = await _settled(store, items, known, resend_after_s) if known else set()
        for entity, text, task_key in items:
            if await store.add(job.name, entity, task_key, text):
                done.append(Submitted(job.name, entity, task_key, queued=True))
                unsent.append(done[-1])
            elif task_key in settled:
                done.append(Submitted(job.name, entity, task_key, queued=False))
            else:
                done.append(
                    await _known(
                        store, queue, job, entity, task_key, resend_after_s, task_key in known
                    )
                )
        if unsent:
            messages = [
                QueueMessage("entity_task", job.name, "", entity_id=t.entity_id, key=t.key)
                for t in unsent
            ]
            try:
                await queue.send([message.to_json() for message in messages])
            except QueueError as exc:
                if exc.unsent is not None:  # the queue says which it took: those stay
                    unsent = [unsent[i] for i in exc.unsent]
                raise
            unsent = []
    except BaseException:
        taken_back = {id(t) for t in unsent}
        await _withdraw(store, job.name, [t.key for t in unsent])
        if on_sent is not None:
            on_sent([t for t in done if id(t) not in taken_back])
        raise
    if on_sent is not None:
        on_sent(done)
    return done


async def _known(
    store: TaskStore,
    queue: WorkQueue,
    job: Task,
    entity: int,
    key: str,
    resend_after_s: float,
    looked_up: bool,
) -> Submitted:
    """A key submitted before: a no-op, unless its message looks lost (sent again).
    ``looked_up``: its row was found, for this entity, before the insert, and it may look
    lost (``_settled``); otherwise it is read here, and settled as there."""
    if not looked_up:
        row = (await store.submitted_many(job.name, [key])).get(key)
        if row is not None and row.entity_id != entity:
            raise BadTask(f"task key {key!r} was submitted for entity {row.entity_id}")
        if row is None or not row.unstarted:
            return Submitted(job.name, entity, key, queued=False)
        if row.settled(await store.db.clock_ms() - int(resend_after_s * 1000)):
            return Submitted(job.name, entity, key, queued=False)
    resent = await resend_if_lost(
        store,
        queue,
        job.name,
        entity,
        key,
        after_s=resend_after_s,
        serial=job.serial == "entity",
    )
    return Submitted(job.name, entity, key, queued=resent, resent=resent)


async def _withdraw(store: TaskStore, job: str, keys: list[str]) -> None:
    """Take back the submissions whose message was not sent, in one statement; the error
    that stopped the sending is the one to report, so a failure here is only logged.

    Shielded: a second cancellation (the first is often what stopped the sending) ends
    the wait for it, not the statement, which would otherwise leave rows that no message
    names until the lost-task sweep (``BATCHRUN_TASK_RESEND_S``)."""
    if not keys:
        return
    withdrawal = asyncio.ensure_future(store.withdraw(job, keys))
    _WITHDRAWING.add(withdrawal)  # held until done: the loop keeps only a weak reference
    withdrawal.add_done_callback(functools.partial(_withdrawn, job, keys))
    with contextlib.suppress(Exception):  # logged there
        await asyncio.shield(withdrawal)


_WITHDRAWING: set[asyncio.Future[int]] = set()


def _withdrawn(job: str, keys: list[str], done: asyncio.Future[int]) -> None:
    _WITHDRAWING.discard(done)
    # cancelled: the loop ended first (a caller's asyncio.run returning)
    why = "cancelled before it ran" if done.cancelled() else done.exception()
    if why is not None:
        log.error(
            "%d task(s) of job %r recorded but not queued (%s): the lost-task sweep sends them: %s",
            len(keys),
            job,
            ", ".join(repr(k) for k in keys[:5]) + (" ..." if len(keys) > 5 else ""),
            why,
        )

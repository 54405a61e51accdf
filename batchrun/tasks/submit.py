"""Queue one submitted task: checked, recorded once per (job, key), then sent."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from batchrun.db.base import Database
from batchrun.job import Job
from batchrun.queue.base import QueueMessage, WorkQueue
from batchrun.task import BadTask, Task, checked
from batchrun.tasks.resend import resend_if_lost
from batchrun.tasks.store import TaskStore

log = logging.getLogger(__name__)


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
    entity, text, task_key = checked(entity_id, data, key)
    store = TaskStore(db)
    added = await store.submit(job.name, entity, task_key, text)
    if not added:
        row = await store.get(job.name, task_key)
        if row is not None and row.entity_id != entity:
            raise BadTask(f"task key {task_key!r} was submitted for entity {row.entity_id}")
        resent = row is not None and await resend_if_lost(
            store,
            queue,
            job.name,
            entity,
            task_key,
            after_s=resend_after_s,
            serial=job.serial == "entity",
        )
        return Submitted(job.name, entity, task_key, queued=resent, resent=resent)
    message = QueueMessage("entity_task", job.name, "", entity_id=entity, key=task_key)
    try:
        await queue.send([message.to_json()])
    except BaseException:
        try:
            await store.withdraw(job.name, task_key)
        except Exception as exc:  # the send's error is the one to report
            log.error("task %r of job %r recorded but not queued: %s", task_key, job.name, exc)
        raise
    return Submitted(job.name, entity, task_key, queued=True)

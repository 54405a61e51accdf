"""``batchrun.connect``: submit tasks from an application, with no CLI and no event loop.

    client = batchrun.connect()            # BATCHRUN_DB, BATCHRUN_RETRY_QUEUE, BATCHRUN_JOBS
    key = client.submit("transcode", user.id, data={"upload": upload.id})

``submit`` is synchronous, for Django or Flask views: the client runs its database and
queue connections in an event loop of its own, on a daemon thread. ``await
client.asubmit(...)`` is the same from async code (any event loop). ``submit_many`` queues
many tasks of one job in a few statements and queue calls.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from batchrun.db.base import Database
from batchrun.db.base import connect as connect_db
from batchrun.job import Job
from batchrun.queue.base import WorkQueue, from_url
from batchrun.registry import builtin_modules, discover, parse_specs
from batchrun.settings import Settings
from batchrun.task import BadTask
from batchrun.tasks.submit import Submitted, submit, submit_many, task_job

T = TypeVar("T")
# One task for ``submit_many``: (entity_id, data) or (entity_id, data, key).
TaskSpec = tuple[int, dict[str, Any] | None] | tuple[int, dict[str, Any] | None, str | None]


def _spec(task: object) -> tuple[object, object, object]:
    """(entity_id, data, key) of one ``submit_many`` task, or BadTask for another shape."""
    if isinstance(task, tuple) and len(task) in (2, 3):
        return (task[0], task[1], task[2] if len(task) == 3 else None)
    raise BadTask(f"a task is (entity_id, data) or (entity_id, data, key), not {task!r:.80}")


class Client:
    """Submits tasks to the Task jobs it knows; ``close()`` (or ``with``) when done."""

    def __init__(self, settings: Settings, jobs: Mapping[str, Job]) -> None:
        self.settings = settings
        self.jobs = dict(jobs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._db: Database | None = None
        self._queue: WorkQueue | None = None
        self._opening = asyncio.Lock()

    def submit(
        self, job: str, entity_id: int, data: dict[str, Any] | None = None, key: str | None = None
    ) -> str:
        """Queue one task for ``entity_id``; return its key (a new one when none is given).

        A key already submitted is a no-op (see ``submit_task`` for whether it was queued),
        unless its task was never started ``BATCHRUN_TASK_RESEND_S`` (300) after its
        submission: its message looks lost (its submitter died before sending it) and is
        sent again.
        Raises ``batchrun.tasks.BadTask`` before anything is queued for data that is not a
        JSON object or is over 200 KB, or for a job that is not a known Task job; and
        ``QueueError`` when the queue does not take the message, the submission then taken
        back, so the same key can be submitted again."""
        return self.submit_task(job, entity_id, data=data, key=key).key

    def submit_task(
        self, job: str, entity_id: int, data: dict[str, Any] | None = None, key: str | None = None
    ) -> Submitted:
        """``submit``, saying also whether it was queued (False: the key was known)."""
        return self._call(self._submit(job, entity_id, data, key)).result()

    async def asubmit(
        self, job: str, entity_id: int, data: dict[str, Any] | None = None, key: str | None = None
    ) -> str:
        """``submit`` for async code: awaits the client's own loop, blocking none."""
        done = await asyncio.wrap_future(self._call(self._submit(job, entity_id, data, key)))
        return done.key

    async def _submit(
        self, job: str, entity_id: int, data: dict[str, Any] | None, key: str | None
    ) -> Submitted:
        task = task_job(self.jobs, job)  # before connecting: an unknown job queues nothing
        db, queue = await self._open()
        return await submit(
            db, queue, task, entity_id, data, key, resend_after_s=self.settings.task_resend_s
        )

    def submit_many(self, job: str, tasks: Iterable[TaskSpec]) -> list[Submitted]:
        """Queue many tasks of ``job``, each ``(entity_id, data)`` or ``(entity_id, data,
        key)``: what each became, in order (``key``, and ``queued`` False for a key
        submitted before). One statement a task and one queue call per ten, where
        ``submit`` makes two statements and a queue call each. A key submitted before
        costs its statement too; the look for a lost message (three more) is taken only
        for one never started and older than ``BATCHRUN_TASK_RESEND_S``.

        Raises ``BadTask`` before anything is queued when any task is bad, or its key was
        given for another entity. On a ``QueueError`` the tasks whose message was not
        queued are taken back: submitting the same tasks again queues those and is a no-op
        for the rest, when each has its key."""
        return self._call(self._submit_many(job, list(tasks))).result()

    async def asubmit_many(self, job: str, tasks: Iterable[TaskSpec]) -> list[Submitted]:
        """``submit_many`` for async code: awaits the client's own loop, blocking none."""
        return await asyncio.wrap_future(self._call(self._submit_many(job, list(tasks))))

    async def _submit_many(self, job: str, tasks: list[TaskSpec]) -> list[Submitted]:
        task = task_job(self.jobs, job)
        specs = [_spec(t) for t in tasks]  # a malformed one queues nothing
        db, queue = await self._open()
        return await submit_many(db, queue, task, specs, resend_after_s=self.settings.task_resend_s)

    async def _open(self) -> tuple[Database, WorkQueue]:
        async with self._opening:
            if self._db is None or self._queue is None:
                db = await connect_db(self.settings.db_url, pool_size=2)
                queue = from_url(
                    self.settings.retry_queue_url,
                    db=db,
                    max_receives=self.settings.max_receives,
                    env=self.settings.extra,
                )
                await queue.open()
                self._db, self._queue = db, queue
            return self._db, self._queue

    def _call(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if self._loop.is_closed():
            coro.close()  # never started: no "was never awaited" warning
            raise RuntimeError("this batchrun client is closed: batchrun.connect() a new one")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def close(self) -> None:
        """Close the connections and stop the client's thread."""
        if self._loop.is_closed():
            return
        self._call(self._close()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _close(self) -> None:
        if self._queue is not None:
            await self._queue.close()
        if self._db is not None:
            await self._db.close()
        self._db = self._queue = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    db: str | None = None,
    queue: str | None = None,
    jobs: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Client:
    """A client for the database ``db``, the queue ``queue`` and the jobs ``jobs`` (module
    names or ``.py`` paths, comma-separated); each defaults to the environment's
    ``BATCHRUN_DB`` / ``BATCHRUN_RETRY_QUEUE`` / ``BATCHRUN_JOBS``; the built-in jobs are
    those ``BATCHRUN_BUILTIN_JOBS`` names, as for the CLI. Connects on first use."""
    environ = dict(os.environ if env is None else env)
    if db is not None:
        environ["BATCHRUN_DB"] = db
    if queue is not None:
        environ["BATCHRUN_RETRY_QUEUE"] = queue
    if jobs is not None:
        environ["BATCHRUN_JOBS"] = jobs
    settings = Settings.from_env(environ)
    registry = discover(parse_specs(settings.jobs), builtins=builtin_modules(settings.builtin_jobs))
    return Client(settings, {name: registry.get_job(name) for name in registry})

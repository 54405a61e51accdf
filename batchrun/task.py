"""``batchrun.Task``: a job whose entities come from submissions, not from a page.

    class Transcode(batchrun.Task):
        name = "transcode"

        async def process(self, ctx, task):   # task.entity_id, task.key, task.data
            ...

Each (job, key) runs exactly once. With ``serial = "entity"`` (the default) one entity's
tasks never run at once, in any process or Lambda, and run in the order they were
submitted; tasks of different entities run in parallel up to ``--concurrency``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from batchrun.db.store import MAX_ID
from batchrun.job import Context, Job
from batchrun.period import Unit

MAX_DATA = 200 * 1024  # bytes of a task's data, as JSON
KEY = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces


class BadTask(ValueError):
    """A submission refused before anything is queued; its message is the one line.
    ``key``: the task key it is about, when one is to blame."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class TaskItem:
    """What ``Task.process`` is given beside the context."""

    entity_id: int
    key: str
    data: dict[str, Any] = field(default_factory=dict)


class Task(Job):
    """A job of submitted tasks: subclass it, set ``name``, write ``process(ctx, task)``.

    Class attributes, beside ``Job``'s: ``serial`` is ``"entity"`` (one task of an entity
    at a time, in submission order) or ``"none"`` (no such limit). ``period`` only names
    the period the context carries (the current one).
    """

    serial: ClassVar[Literal["entity", "none"]] = "entity"
    period: ClassVar[Unit] = "day"

    async def page(self, ctx: Context, after: int, limit: int) -> list[dict[str, Any]]:
        """A task job has no page: its entities come from submissions."""
        return []

    async def process(self, ctx: Context, task: Any) -> None:
        """Do one task (a ``TaskItem``). Returning is success; raise ``Skip``, ``Retry``
        or ``Fail``."""
        raise NotImplementedError


def is_task(job: Job) -> bool:
    return isinstance(job, Task)


def checked(entity_id: object, data: object, key: object) -> tuple[int, str, str]:
    """(entity id, data as JSON, key) of a submission, or BadTask with the one line."""
    if not isinstance(entity_id, int) or isinstance(entity_id, bool):
        raise BadTask(f"entity id {entity_id!r} is not an integer")
    if not 0 < entity_id <= MAX_ID:
        raise BadTask(f"entity id {entity_id} is out of range")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadTask("task data must be a JSON object")
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadTask(f"task data is not JSON: {exc}") from None
    if len(text) > MAX_DATA // 6:  # could be over: measured as UTF-8, not as stored
        # Stored ASCII-escaped (a lone surrogate survives every database), where a
        # character past Latin takes 6 or 12 bytes: the limit is the JSON's UTF-8 size.
        size = len(_utf8_json(data))
        if size > MAX_DATA:
            raise BadTask(f"task data is over {MAX_DATA // 1024} KB ({size} bytes)")
    if key is None:
        key = uuid.uuid4().hex  # without a key each submission is its own task
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise BadTask("task key must be 1-200 printable ASCII characters, no spaces")
    return entity_id, text, key


def _utf8_json(data: dict[str, Any]) -> bytes:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")

"""Task jobs the task tests run: each writes its start and end to ``task_effect``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import batchrun


class Steps(batchrun.Task):
    name = "steps"
    description = "a task that records its interval per entity"

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        started = time.time_ns()
        await asyncio.sleep(float(task.data.get("sleep", 0.002)))
        await ctx.db.execute(
            "INSERT INTO task_effect (entity_id, task_key, seq, started_ns, ended_ns, pid)"
            " VALUES (:e, :k, :s, :a, :b, :p)",
            e=task.entity_id,
            k=task.key,
            s=int(task.data.get("seq", 0)),
            a=started,
            b=time.time_ns(),
            p=__import__("os").getpid(),
        )


class Loose(Steps):
    """``steps`` with no order per entity (``serial = "none"``): its tasks take no turn."""

    name = "loose"
    serial = "none"


class Flaky(batchrun.Task):
    """Its first attempt of a task fails, asking to be tried again in ``retry_s`` (data,
    0.01 s unless given); each attempt records when it started."""

    name = "flaky"
    retry = batchrun.RetryPolicy(attempts=3, backoff=0.01, max_delay_s=10)

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        if task.data.get("fail") == "always":
            raise batchrun.Fail("told to fail")
        started = time.time_ns()
        rows = await ctx.db.fetch(
            "SELECT COUNT(*) AS n FROM task_effect WHERE task_key = :k", k=task.key
        )
        await ctx.db.execute(
            "INSERT INTO task_effect (entity_id, task_key, seq, started_ns, ended_ns, pid)"
            " VALUES (:e, :k, 0, :a, :a, 0)",
            e=task.entity_id,
            k=task.key,
            a=started,
        )
        if int(rows[0]["n"]) == 0:
            raise batchrun.Retry("first attempt fails", delay_s=task.data.get("retry_s", 0.01))


class Slotted(batchrun.Task):
    """Holds the shared backend ``slot`` (one call at a time across every process) for
    ``hold_s`` and records the interval it held it."""

    name = "slotted"
    backends = {"slot": batchrun.Backend(concurrency=1, shared=True)}

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        async with ctx.backend("slot"):
            started = time.time_ns()
            await asyncio.sleep(float(task.data.get("hold_s", 0.02)))
            ended = time.time_ns()
        await ctx.db.execute(
            "INSERT INTO task_effect (entity_id, task_key, seq, started_ns, ended_ns, pid)"
            " VALUES (:e, :k, 0, :a, :b, :p)",
            e=task.entity_id,
            k=task.key,
            a=started,
            b=ended,
            p=__import__("os").getpid(),
        )

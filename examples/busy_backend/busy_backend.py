"""Seed 001: hand each uploaded file to a backend that takes one task at a time, only when
it is idle, without a Lambda polling loop.

The application submits one task per uploaded file (``client.submit("files", user_id,
data={"s3_url": ...})``); ``batchrun worker`` processes or the SQS-triggered Lambda run
them. The backend (``backend.py``) says ``busy`` or ``idle`` on ``GET
/api/worker-status`` and must never be sent work while busy, so the job declares it:

- ``concurrency=1, shared=True``: one call in flight across every worker and Lambda, a
  slot in batchrun's database (a worker killed mid-call frees it when its lease ends);
- ``ready=idle``: before each call, holding that slot, batchrun asks the status endpoint
  (every ``READY_EVERY_S`` at most) and sends only on ``idle``.

Busy is no failure: a worker waits; the Lambda waits up to ``BATCHRUN_BUSY_WAIT_S`` in
the invocation, then gives the task back to SQS with a delay that grows while the backend
stays busy (never dead-lettered for it). A task handed over is recorded in
``file_handoff`` under its key, and the backend drops a second hand-off of the same
``Idempotency-Key``: a crash between the two hands it over once. The backend's base URL
is ``BATCHRUN_BACKEND_WORKER_URL``.
"""

from __future__ import annotations

from typing import Any

import batchrun

READY_EVERY_S = 0.25  # a backend whose tasks take minutes can be asked every few seconds


async def idle(ctx: batchrun.Context) -> bool:
    """Whether the backend can take a task now (its status endpoint says ``idle``)."""
    response = await ctx.http("worker").get("/api/worker-status")
    return response.status_code == 200 and response.json().get("status") == "idle"


class Files(batchrun.Task):
    name = "files"
    description = "hand each uploaded file to the one-task-at-a-time worker when it is idle"
    sql = batchrun.SqlFolder.beside(__file__)
    backends = {
        "worker": batchrun.Backend(
            concurrency=1, shared=True, ready=idle, ready_every_s=READY_EVERY_S
        )
    }

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        s3_url = task.data.get("s3_url")
        if not isinstance(s3_url, str) or not s3_url.startswith("s3://"):
            raise batchrun.Fail(f"no s3:// URL in the task: {s3_url!r}")
        if await ctx.db.fetch(ctx.sql("handed_off"), key=ctx.key):
            return  # handed over before; only batchrun's record of it was missed
        response = await ctx.http("worker").post(
            "/api/process-task", json={"s3_url": s3_url}, headers={"Idempotency-Key": ctx.key}
        )
        response.raise_for_status()  # a 503 never gets here: it is busy, waited out
        await ctx.db.execute(
            ctx.sql("record_handoff"), key=ctx.key, user_id=task.entity_id, s3_url=s3_url
        )

"""Seed 000: a web application's uploads, processed per user one task at a time.

A user's upload starts three tasks, ``scan``, ``thumbnail`` and ``publish``, submitted in
that order from the web request (``app.py``). Users' tasks run in parallel across every
worker and Lambda; one user's tasks never overlap and run in the order submitted, so
``publish`` always sees its ``scan`` and ``thumbnail`` done. Each task records one row in
``upload_step`` keyed by the task's key, so a rerun after a crash adds no second row.
"""

from __future__ import annotations

from typing import Any

import batchrun

KINDS = ("scan", "thumbnail", "publish")


class Uploads(batchrun.Task):
    name = "uploads"
    description = "scan, thumbnail and publish each upload, one task of a user at a time"
    serial = "entity"  # the default: one user's tasks one at a time, in submission order
    sql = batchrun.SqlFolder.beside(__file__)

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        kind = task.data.get("kind")
        upload = task.data.get("upload_id")
        if kind not in KINDS or not isinstance(upload, int):
            raise batchrun.Fail(f"bad task data: kind {kind!r}, upload_id {upload!r}")
        if kind == "publish":
            done = await ctx.db.fetch(ctx.sql("steps_done"), upload_id=upload)
            if {row["kind"] for row in done} != {"scan", "thumbnail"}:
                raise batchrun.Fail(f"upload {upload}: publish before scan and thumbnail")
        await ctx.db.execute(
            ctx.sql("record_step"),
            task_key=task.key,
            user_id=task.entity_id,
            upload_id=upload,
            kind=kind,
        )


def submit_upload(client: Any, user_id: int, upload_id: int) -> list[str]:
    """What the web request calls: three tasks for the user, keyed by upload and kind, so a
    retried request queues nothing twice. Returns the keys."""
    return [
        client.submit(
            "uploads",
            user_id,
            data={"kind": kind, "upload_id": upload_id},
            key=f"upload-{upload_id}-{kind}",
        )
        for kind in KINDS
    ]

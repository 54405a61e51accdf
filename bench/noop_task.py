"""The no-op task job of ``bench/tasks_rate.py``: each task does nothing, so a worker's
rate is batchrun's own cost per task (queue, turn, task row, ledger of the outcome)."""

from __future__ import annotations

from typing import Any

import batchrun


class Noop(batchrun.Task):
    name = "noop"
    description = "a task that does nothing (bench/tasks_rate.py)"

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        return None

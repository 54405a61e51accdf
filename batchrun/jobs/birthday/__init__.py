"""The built-in birthday job (``batchrun birthday``), and the demo users it runs on."""

from __future__ import annotations

from batchrun.jobs.birthday.job import Birthday

__all__ = ["Birthday"]

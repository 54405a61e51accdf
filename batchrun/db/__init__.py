"""Database access: adapters per dialect, the named-query loader and the store."""

from __future__ import annotations

from batchrun.db.base import Database, connect
from batchrun.db.store import Store

__all__ = ["Database", "Store", "connect"]

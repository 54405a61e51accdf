"""batchrun: per-user batch jobs against your own database, exactly once."""

from __future__ import annotations

__version__ = "0.1.0"

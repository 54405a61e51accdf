"""Retry queues: the protocol, the local table backend, SQS later."""

from __future__ import annotations

from batchrun.queue.base import PoisonMessage, QueueMessage, Received, WorkQueue, from_url

__all__ = ["PoisonMessage", "QueueMessage", "Received", "WorkQueue", "from_url"]

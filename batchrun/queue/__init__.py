"""Work queues (retries, submitted tasks, continuations, shards): the protocol, the local
table (queue/local.py), SQS with its dead-letter queue (queue/sqs.py), dead letters
(queue/dead.py)."""

from __future__ import annotations

from batchrun.queue.base import PoisonMessage, QueueMessage, Received, WorkQueue, from_url

__all__ = ["PoisonMessage", "QueueMessage", "Received", "WorkQueue", "from_url"]

"""What the road is handed: its collaborators as values, never the runtime that made them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from batchrun.policy.retry import RetryPolicy

if TYPE_CHECKING:
    from batchrun.control.steering import Steering
    from batchrun.db.store import Store
    from batchrun.effects.lender import Effects
    from batchrun.job import Job
    from batchrun.queue.base import WorkQueue
    from batchrun.settings import Settings


@dataclass(frozen=True, slots=True)
class Wiring:
    """The store, the queue, the effects and the policies every stage of the road uses.

    Args:
        store: batchrun's ledger (and the job's database behind it).
        queue: where retries, continuations and tasks go (None: a command without one).
        effects: contexts for the jobs' methods, with their mail and pacers.
        steering: pause and cancel, as the heartbeats last read them.
        settings: the deployment's figures (lease, thresholds, backoff).
    """

    store: Store
    queue: WorkQueue | None
    effects: Effects
    steering: Steering
    settings: Settings

    def policy(self, job: Job, *, run: bool = False) -> RetryPolicy:
        """``job``'s retry policy over the deployment's (settings, the queue's receives).

        For a period run (``run``) the deployment's attempts do not apply: they count the
        queue's receives, and a rerun's attempt at an entity waiting for its retry is no
        receive (the consumer gives up). A job's own ``RetryPolicy(attempts=…)`` applies.
        """
        receives = self.queue.max_receives if self.queue is not None else None
        defaults = RetryPolicy.defaults(self.settings, receives)
        if run:
            defaults = replace(defaults, attempts=None)
        return job.retry.over(defaults)

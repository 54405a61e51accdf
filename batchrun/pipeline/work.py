"""One entity's work, the same for every item on the road (a page's entity, one a message
names, a submitted task): fence, process, classify, settle by the job's RetryPolicy, and
hand the outcome to the applier.

A busy backend (``Busy`` out of ``process``) is no outcome yet: the entity waits with
backoff within its ``Patience`` (a run's is unbounded, a consumer's is
``BATCHRUN_BUSY_WAIT_S``; a stop ends it) and ``process`` runs again; once the patience is
spent the outcome is busy, and the applier gives the entity back without an attempt.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from batchrun.errors import ConfigError, ThrottledError
from batchrun.job import Busy, Context, Job, returned_note
from batchrun.pipeline.apply import Applier
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.item import Item
from batchrun.pipeline.lease import Fence
from batchrun.pipeline.outcomes import SUCCEEDED, Classified, Outcome, classify
from batchrun.policy.bugs import BugStreak, signature
from batchrun.policy.busy import Patience, set_patience
from batchrun.policy.pacing import CircuitBreaker
from batchrun.policy.rate import AdaptiveRate
from batchrun.policy.retry import RetryPolicy
from batchrun.urls import mask_url

log = logging.getLogger(__name__)


class EntityWorker:
    """Works claimed entities (or tasks) of one job through ``process``."""

    def __init__(
        self,
        job: Job,
        ctx: Context,
        *,
        lease: Fence,
        applier: Applier,
        breaker: CircuitBreaker,
        stop: StopToken,
        limiter: AdaptiveRate | None = None,
        policy: RetryPolicy | None = None,
        at_once: bool = True,
        on_outcome: Callable[[Item, Outcome, bool], None] | None = None,
        bugs: BugStreak | None = None,
        on_done: Callable[[Item], None] | None = None,
        busy_wait_s: float | None = None,
    ) -> None:
        self.job = job
        self.ctx = ctx
        self.lease = lease
        self.applier = applier
        self.breaker = breaker
        self.stop = stop
        self.limiter = limiter
        self.policy = policy or RetryPolicy()  # resolved: the job's over the deployment's
        self.at_once = at_once  # a run's failures are retried at once; a consumer's back off
        self.on_outcome = on_outcome  # told each outcome once written, or not (False)
        self.bugs = bugs  # the same error for many entities in a row stops the work
        self.on_done = on_done  # told when an item leaves the worker, worked or not
        # How long an entity waits for a busy backend (None: until it is free, a run's).
        self.busy_wait_s = busy_wait_s
        self._told_returned = False  # process() returned a value: said once
        self.unstarted: list[Item] = []  # not attempted (stopped, breaker open): the caller's
        self.lost: list[Item] = []

    async def work(self, item: Item) -> None:
        if self.on_done is None:
            await self._work(item)
            return
        try:
            await self._work(item)
        finally:
            self.on_done(item)

    async def _work(self, item: Item) -> None:
        if self.lease.lost(item):
            self.lost.append(item)
            return
        if self.breaker.open:
            # Not attempted: the caller queues it (a run) or leaves its message for later
            # (a consumer); an attempt the backend never saw does not count against it.
            self.unstarted.append(item)
            return
        if not await self.lease.fence():
            self.unstarted.append(item)
            return
        elif self.lease.lost(item):
            self.lost.append(item)  # the heartbeat the fence waited for found it taken
            return
        elif self.bugs is not None and not await self.bugs.admit():
            self.unstarted.append(item)  # a bug stopped the work: left for a fixed job
            return
        else:
            try:
                outcome = await self._process(item)
            finally:
                if self.bugs is not None:
                    await self.bugs.done()
        if outcome is not SUCCEEDED:  # the policy decides failures; a success stays one
            # The ledger counts attempts: the run's first one, then one per retry.
            outcome = self.policy.settle(outcome, item.attempts, at_once=self.at_once)
        recorded = False
        try:
            await self.applier.record(item, outcome)
            recorded = True
        finally:
            if self.on_outcome is not None:
                self.on_outcome(item, outcome, recorded)

    async def _process(self, item: Item) -> Outcome:
        patience = Patience(self.stop, self.busy_wait_s)
        restore = set_patience(patience)
        try:
            while True:
                try:
                    ctx = self.ctx.entity(item.id)
                    if item.key is not None:
                        ctx.key = item.key  # a submitted task's own idempotency key
                    # Typed None; a job's own may return a value all the same.
                    returned = await self.job.process(ctx, item.argument)  # type: ignore[func-returns-value]
                    ctx.check_awaited()
                    if returned is not None and not self._told_returned:
                        self._told_returned = True
                        log.warning("%s", returned_note(self.job.name, returned))
                except Busy as exc:
                    # Not an attempt: wait and go again while the patience lasts.
                    if await patience.sleep(patience.backoff_s(exc.delay_s)):
                        continue
                    return classify(exc)
                except Exception as exc:
                    self._bug(exc)
                    _tell(self.job.name, item.id, exc)
                    return self._failed(exc)
                break
        finally:
            restore()
        self.breaker.success()
        if self.bugs is not None:
            self.bugs.success()
        return SUCCEEDED

    def _bug(self, exc: Exception) -> None:
        if self.bugs is not None and self.bugs.failure(exc, job=self.job.name):
            log.info("%s", self.bugs.tripped)  # the command says it once, at its end
            self.stop.request("bug in the job")

    def _failed(self, exc: Exception) -> Outcome:
        outcome = classify(exc)  # settled by the policy in ``work``
        if outcome.stop_reason is not None:
            # A backend's own breaker opened: stop as for the mail backend, for its reason.
            if self.breaker.failure(halt=True):
                log.error("stopping: %s; the rest is queued for retry", outcome.stop_reason)
                self.breaker.reason = outcome.stop_reason
                self.stop.request(outcome.stop_reason)
        elif outcome.connection:
            if self.breaker.failure(halt=outcome.halt):
                if outcome.halt:
                    log.error("stopping: %s; the rest is queued for retry", outcome.reason)
                    self.breaker.reason = outcome.reason
                else:
                    log.error(
                        "backend unreachable after %d connection failures in a row; stopping",
                        self.breaker.consecutive,
                    )
                self.stop.request("mail backend unreachable")
        elif not self.breaker.open:  # a call the open breaker refused is no success
            self.breaker.success()
        fed = isinstance(exc, ThrottledError | Classified)  # the pacer has slowed the rate
        if outcome.throttled and self.limiter is not None and not fed:
            self.limiter.throttled(outcome.delay_s)  # an HTTP 429 outside ctx.paced()
        return outcome


def _tell(job: str, entity_id: int, exc: Exception) -> None:
    """``-v``: an error the job's code raised (no verdict, no outage: a bug), with its
    frames; ``-vv``: any other failure's reason."""
    if signature(exc) is not None and not isinstance(exc, ConfigError):
        if log.isEnabledFor(logging.INFO):
            frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
            log.info(
                "%s entity %d raised %s: %s\nTraceback (most recent call last):\n%s",
                job,
                entity_id,
                type(exc).__name__,
                mask_url(str(exc)),
                frames,
            )
    else:
        log.debug("%s entity %d: %s", job, entity_id, mask_url(str(exc)))

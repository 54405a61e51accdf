"""``RetryPolicy``: how one job's failures are classified, when they give up, how long they wait.

Every path applies it the same way (a period run, ``retry``, ``worker``, the Lambda's SQS
consumer), through ``settle``:

    outcome of process (classify)   -> RETRYING, FAILED, SKIPPED or succeeded
    RETRYING at the last attempt    -> FAILED "gave up after N attempts: ..."
    busy (a backend was busy)       -> untouched: no attempt, never given up on
    RETRYING                        -> its delay: the job's ``Retry(delay_s)`` or an HTTP
                                       429's ``Retry-After`` if given, else at once for a
                                       run's failure and an exponential backoff with jitter
                                       for a retry's; never above ``max_delay_s``

Unset fields take the deployment's defaults (``over``): ``BATCHRUN_MAX_RECEIVES`` (or an
SQS queue's redrive ``maxReceiveCount``) retries after the first attempt,
``BATCHRUN_RETRY_BASE_S`` and ``BATCHRUN_RETRY_MAX_BACKOFF_S``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchrun.pipeline.outcomes import Outcome
    from batchrun.settings import Settings


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A job's retry policy (``Job.retry``); None fields take the deployment's defaults.

    Args:
        attempts: tries in all, the first included; 1 never retries. A failure on the
            last one is final (dead-lettered). On SQS the queue's redrive
            ``maxReceiveCount`` still dead-letters a message first if it is lower.
        backoff: seconds before the first retry of a failed retry; doubles each time
            (full jitter in its upper half).
        max_delay_s: the longest any retry waits: the backoff and a job's or a peer's
            requested delay alike.
    """

    attempts: int | None = None
    backoff: float | None = None
    max_delay_s: float | None = None

    def __post_init__(self) -> None:
        if self.attempts is not None and (
            isinstance(self.attempts, bool) or not isinstance(self.attempts, int)
        ):
            raise TypeError(f"attempts must be an int, got {self.attempts!r}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        for name in ("backoff", "max_delay_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")

    @classmethod
    def defaults(cls, settings: Settings, max_receives: int | None = None) -> RetryPolicy:
        """The deployment's policy: one run's attempt plus one per receive the queue allows."""
        receives = settings.max_receives if max_receives is None else max_receives
        return cls(
            attempts=receives + 1,
            backoff=settings.retry_base_s,
            max_delay_s=settings.retry_max_backoff_s,
        )

    def over(self, defaults: RetryPolicy) -> RetryPolicy:
        """This policy with its unset fields taken from ``defaults``."""
        return RetryPolicy(
            attempts=self.attempts if self.attempts is not None else defaults.attempts,
            backoff=self.backoff if self.backoff is not None else defaults.backoff,
            max_delay_s=self.max_delay_s if self.max_delay_s is not None else defaults.max_delay_s,
        )

    def classify(self, exc: BaseException, attempts: int, *, at_once: bool) -> Outcome:
        """The settled outcome of ``exc`` escaping ``process`` (see ``settle``)."""
        from batchrun.pipeline.outcomes import classify

        return self.settle(classify(exc), attempts, at_once=at_once)

    def settle(self, outcome: Outcome, attempts: int, *, at_once: bool) -> Outcome:
        """Decide a failure: give up at the last attempt, else when to try again.

        Args:
            outcome: how the attempt ended (``classify``).
            attempts: attempts finished before this one (the ledger's count).
            at_once: a run's failure, queued to be retried at once unless a delay was
                asked for; False for a retry's, which backs off.
        """
        from batchrun.db.store import State

        if outcome.state is not State.RETRYING or outcome.busy:
            return outcome  # busy is no attempt: it never gives up, its delay is the road's
        if self.attempts is not None and attempts + 1 >= self.attempts:
            return replace(
                outcome,
                state=State.FAILED,
                reason=f"gave up after {attempts + 1} attempts: {outcome.reason}",
                delay_s=None,
            )
        return replace(outcome, delay_s=self.delay_s(outcome.delay_s, attempts, at_once=at_once))

    def delay_s(self, asked_s: float | None, attempts: int, *, at_once: bool) -> float:
        """Seconds before the next attempt: ``asked_s`` (a ``Retry(delay_s)``, a
        ``Retry-After``) if given, else 0 for a run's failure or the backoff for a retry's;
        at most ``max_delay_s``."""
        delay = asked_s
        if delay is None:
            if at_once:
                return 0.0
            from batchrun.queue.base import backoff_s

            delay = backoff_s(
                attempts + 1,
                base_s=self.backoff if self.backoff is not None else 30.0,
                max_s=self.max_delay_s if self.max_delay_s is not None else math.inf,
            )
        delay = max(0.0, delay)
        if self.max_delay_s is not None:
            delay = min(delay, self.max_delay_s)
        return delay


__all__ = ["RetryPolicy"]

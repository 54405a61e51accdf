"""The verdicts a job's ``process`` may raise: ``Skip``, ``Retry``, ``Fail``, and ``Busy`` for a
backend that cannot take a call now. How each is applied: ``batchrun/pipeline/outcomes.py``."""

from __future__ import annotations


class Verdict(Exception):
    """Base of the verdicts ``process`` may raise; carries a short reason (the class's own
    when none is given: ``Skip()`` was a ``TypeError``, retried as a bug)."""

    default_reason = "the job's verdict"

    def __init__(self, reason: str = "") -> None:
        reason = reason or self.default_reason
        super().__init__(reason)
        self.reason = reason


class Skip(Verdict):
    """End this entity for good, without failure (counted ``skipped``)."""

    default_reason = "skipped by the job"


class Retry(Verdict):
    """Queue this entity for another attempt, after ``delay_s`` if given."""

    default_reason = "the job asked for a retry"

    def __init__(self, reason: str = "", delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class Fail(Verdict):
    """Fail this entity for good (dead-lettered, listed by ``batchrun status``)."""

    default_reason = "failed by the job"


class Busy(Retry):
    """A backend is busy (not ready, no free slot, or it answered 429 / 503): not a failure.

    ``ctx.backend`` and ``ctx.http`` raise it once an entity has waited as long as it may;
    a job may raise it too, for a busy answer of its own kind. The road never counts it as
    an attempt: a run waits and tries the entity again, a consumer gives it back to its
    queue with a growing delay. Called outside the road (a test calling ``process``), it
    is the ``Retry`` it subclasses, after ``delay_s`` (a ``Retry-After``) if given.
    """

    default_reason = "the backend is busy"

    def __init__(self, reason: str = "", delay_s: float | None = None, backend: str = "") -> None:
        super().__init__(reason, delay_s)
        self.backend = backend


__all__ = ["Busy", "Fail", "Retry", "Skip", "Verdict"]

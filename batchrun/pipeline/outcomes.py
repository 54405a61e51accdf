"""How one entity ended: what ``process`` returned or raised, classified into a ledger state.

    returned                                 -> SENT (succeeded)
    Skip                                     -> SKIPPED, never retried
    Fail, SMTP 5xx for the recipient,        -> FAILED, dead-lettered
      SES MessageRejected, HTTP 4xx (other)
    Retry, SMTP 4xx, timeouts, dropped       -> RETRYING, queued for retry
      connections, HTTP 408/429/5xx,
      httpx transport errors, anything else
    a job statement's reply lost             -> RETRYING, counted unknown_outcome: the
      (OutcomeUnknownError)                     entity is retried as a whole, the
                                                statement never re-run alone
    Busy (a backend not ready, no slot,      -> busy: no attempt counted; a run waits and
      an answer 429 / 503 through it)           tries again, a consumer gives it back

Connection-level failures (the mail backend or an HTTP peer refusing, timing out or
dropping) also feed the circuit breaker; throttling (SES, SMTP 454, HTTP 429) also slows
the adaptive rate. A provider that refuses all mail until someone acts (SES sending paused,
account suspended: ``SendingStoppedError``) opens the breaker at once: the run stops and
queues the rest, with that reason.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from batchrun.db.store import State
from batchrun.errors import (
    BatchrunError,
    MailConnectionError,
    OutcomeUnknownError,
    PermanentMailError,
    SendingStoppedError,
    TemporaryMailError,
    ThrottledError,
)
from batchrun.job import Busy, Fail, Retry, Skip
from batchrun.urls import mask_url, shown

MAX_REASON = 300


@dataclass(frozen=True, slots=True)
class Outcome:
    """One entity's end: its ledger state, why, and a retry delay the job asked for."""

    state: State
    reason: str | None = None
    delay_s: float | None = None
    connection: bool = False  # a connection-level failure: feeds the circuit breaker
    throttled: bool = False  # the peer asked to slow down: slows the adaptive rate
    halt: bool = False  # nothing can pass until someone acts: opens the breaker at once
    unknown: bool = False  # a statement of the job lost its reply: done or not, nobody knows
    busy: bool = False  # a backend was busy: not attempted, no attempt counted, later again
    # a backend's own breaker opened on this failure (or refused the call): the run stops
    # with this reason, as when the mail backend is unreachable
    stop_reason: str | None = None


SUCCEEDED = Outcome(State.SUCCEEDED)


class Classified:
    """A verdict a paced effect raised for an error it classified: the outcome rides along,
    so the breaker still sees a connection failure, and the pacer has fed the rate."""

    outcome: Outcome


class EffectRetry(Classified, Retry):
    """``Retry`` from a paced effect (an HTTP 5xx or 429, a timeout, a dropped connection)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.reason or "retry", outcome.delay_s)
        self.outcome = outcome


class EffectFail(Classified, Fail):
    """``Fail`` from a paced effect (an HTTP 4xx other than 408 and 429, a mail 5xx)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.reason or "failed")
        self.outcome = outcome


def as_verdict(outcome: Outcome) -> Retry | Fail:
    """The verdict a paced effect raises for a classified error."""
    return EffectFail(outcome) if outcome.state is State.FAILED else EffectRetry(outcome)


def classify(exc: BaseException) -> Outcome:
    """The outcome of an exception that escaped ``process``."""
    known = effect_outcome(exc)
    if known is not None:
        return known
    if isinstance(exc, OutcomeUnknownError):
        return Outcome(State.RETRYING, _short(str(exc)), unknown=True)
    if isinstance(exc, BatchrunError):
        return Outcome(State.RETRYING, _short(str(exc)))
    return Outcome(State.RETRYING, _short(f"{type(exc).__name__}: {exc}"))


def effect_outcome(exc: BaseException) -> Outcome | None:
    """The outcome of a verdict, or of an error an effect is known to raise (mail, httpx);
    None for any other exception (a bug in the job, say)."""
    if isinstance(exc, Classified):
        return exc.outcome
    if isinstance(exc, Busy):
        return Outcome(State.RETRYING, _short(exc.reason), exc.delay_s, busy=True)
    if isinstance(exc, Skip):
        return Outcome(State.SKIPPED, _short(exc.reason))
    if isinstance(exc, Retry):
        return Outcome(State.RETRYING, _short(exc.reason), exc.delay_s)
    if isinstance(exc, Fail):
        return Outcome(State.FAILED, _short(exc.reason))
    if isinstance(exc, ThrottledError):
        return Outcome(State.RETRYING, _short(exc.reason), exc.retry_after_s, throttled=True)
    if isinstance(exc, PermanentMailError):
        return Outcome(State.FAILED, _short(exc.reason))
    if isinstance(exc, SendingStoppedError):
        return Outcome(State.RETRYING, _short(exc.reason), connection=True, halt=True)
    if isinstance(exc, MailConnectionError):
        return Outcome(State.RETRYING, _short(exc.reason), connection=True)
    if isinstance(exc, TemporaryMailError):
        return Outcome(State.RETRYING, _short(exc.reason))
    return _http_outcome(exc)


def _http_outcome(exc: BaseException) -> Outcome | None:
    """httpx's errors, without importing httpx where no job uses it."""
    httpx = sys.modules.get("httpx")
    if httpx is None:
        return None
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        status = response.status_code
        reason = _short(f"HTTP {status} from {shown(str(exc.request.url))}")
        if status == 429:
            delay = retry_after_s(response.headers.get("retry-after"))
            return Outcome(State.RETRYING, reason, delay, throttled=True)
        if status == 408 or status >= 500:
            return Outcome(State.RETRYING, reason)
        return Outcome(State.FAILED, reason)
    if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return Outcome(State.RETRYING, _short(_http_error(exc)), connection=True)
    if isinstance(exc, httpx.HTTPError):
        return Outcome(State.RETRYING, _short(_http_error(exc)))
    return None


def _http_error(exc: BaseException) -> str:
    """``ReadTimeout: …`` (httpx's timeouts often say nothing: then where it was going)."""
    text = str(exc)
    if not text:
        try:
            text = f"no answer from {shown(str(exc.request.url))}"  # type: ignore[attr-defined]
        except RuntimeError:  # no request attached
            text = "no detail"
    return f"{type(exc).__name__}: {text}"


BUSY_STATUSES = (429, 503)  # a backend's answers that mean busy, not failed


def busy_answer(exc: BaseException, backend: str = "") -> Busy | None:
    """The ``Busy`` an httpx 429 or 503 (``raise_for_status``) means; None for anything else."""
    httpx = sys.modules.get("httpx")
    if httpx is None or not isinstance(exc, httpx.HTTPStatusError):
        return None
    return busy_response(exc.response, backend)


def busy_response(response: object, backend: str = "") -> Busy | None:
    """The ``Busy`` an httpx response 429 or 503 means (its ``Retry-After`` as the delay);
    None for any other answer."""
    status = getattr(response, "status_code", None)
    if status not in BUSY_STATUSES:
        return None
    url = shown(str(response.request.url))  # type: ignore[attr-defined]
    delay = retry_after_s(response.headers.get("retry-after"))  # type: ignore[attr-defined]
    return Busy(_short(f"busy: HTTP {status} from {url}"), delay, backend=backend)


def retry_after_s(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` value (whole seconds, or an HTTP date) in seconds, if usable;
    None for anything else (a negative, fractional or infinite number)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # delay-seconds: a non-negative integer
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    from datetime import UTC, datetime

    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _short(text: str) -> str:
    return mask_url(text)[:MAX_REASON]

"""RetryPolicy, unit by unit: defaults from the settings, give-up, delays and their cap."""

from __future__ import annotations

from typing import Any

import pytest

import batchrun
from batchrun.db.store import State
from batchrun.pipeline.outcomes import Outcome
from batchrun.policy.retry import RetryPolicy
from batchrun.settings import Settings

RETRYING = Outcome(State.RETRYING, "HTTP 503 from http://api/grants")


def resolved(**fields: Any) -> RetryPolicy:
    return RetryPolicy(**fields).over(RetryPolicy.defaults(Settings()))


def test_it_is_public_api_and_every_job_has_one() -> None:
    assert batchrun.RetryPolicy is RetryPolicy
    assert batchrun.Job.retry == RetryPolicy()


def test_the_defaults_are_todays_settings() -> None:
    # BATCHRUN_MAX_RECEIVES retries after the run's own attempt, the backoff variables
    env = {
        "BATCHRUN_MAX_RECEIVES": "3",
        "BATCHRUN_RETRY_BASE_S": "7",
        "BATCHRUN_RETRY_MAX_BACKOFF_S": "90",
    }
    assert RetryPolicy.defaults(Settings.from_env(env)) == RetryPolicy(4, 7.0, 90.0)
    assert RetryPolicy.defaults(Settings()) == RetryPolicy(6, 30.0, 3600.0)
    # an SQS queue's redrive maxReceiveCount takes the place of BATCHRUN_MAX_RECEIVES
    assert RetryPolicy.defaults(Settings(), max_receives=2).attempts == 3


def test_a_jobs_fields_win_and_unset_ones_take_the_defaults() -> None:
    policy = RetryPolicy(attempts=2).over(RetryPolicy(6, 30.0, 3600.0))
    assert policy == RetryPolicy(2, 30.0, 3600.0)
    assert RetryPolicy(max_delay_s=5.0).over(RetryPolicy(6, 1.0, 60.0)) == RetryPolicy(6, 1.0, 5.0)


@pytest.mark.parametrize(
    "fields",
    [{"attempts": 0}, {"backoff": -1.0}, {"max_delay_s": float("nan")}, {"max_delay_s": -5}],
)
def test_unusable_fields_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**fields)


def test_attempts_must_be_an_int() -> None:
    with pytest.raises(TypeError):
        RetryPolicy(attempts=2.5)  # type: ignore[arg-type]


def test_the_last_attempt_gives_up() -> None:
    policy = resolved(attempts=3)
    assert policy.settle(RETRYING, 1, at_once=False).state is State.RETRYING
    final = policy.settle(RETRYING, 2, at_once=False)  # two finished before: this is the 3rd
    assert final.state is State.FAILED
    assert final.reason == "gave up after 3 attempts: HTTP 503 from http://api/grants"


def test_one_attempt_never_retries_even_in_a_run() -> None:
    assert resolved(attempts=1).settle(RETRYING, 0, at_once=True).state is State.FAILED


def test_other_outcomes_pass_untouched() -> None:
    policy = resolved(attempts=1)
    for outcome in (
        Outcome(State.SUCCEEDED),
        Outcome(State.SKIPPED, "x"),
        Outcome(State.FAILED, "y"),
    ):
        assert policy.settle(outcome, 9, at_once=False) is outcome


def test_a_runs_failure_is_retried_at_once_and_a_retrys_backs_off() -> None:
    policy = resolved(backoff=10.0, max_delay_s=1000.0)
    assert policy.settle(RETRYING, 0, at_once=True).delay_s == 0.0
    for attempts in (1, 2, 3):
        delay = policy.settle(RETRYING, attempts, at_once=False).delay_s
        ceiling = 10.0 * 2**attempts
        assert delay is not None and ceiling / 2 <= delay <= ceiling, (attempts, delay)


def test_the_backoff_stops_at_max_delay() -> None:
    delay = resolved(backoff=10.0, max_delay_s=25.0).settle(RETRYING, 4, at_once=False).delay_s
    assert delay is not None and 12.5 <= delay <= 25.0


@pytest.mark.parametrize("at_once", [True, False])
def test_an_asked_for_delay_wins_on_every_path_up_to_max_delay(at_once: bool) -> None:
    asked = Outcome(State.RETRYING, "429", delay_s=30.0, throttled=True)
    assert resolved().settle(asked, 1, at_once=at_once).delay_s == 30.0
    assert resolved(max_delay_s=5.0).settle(asked, 1, at_once=at_once).delay_s == 5.0
    settled = resolved().settle(asked, 1, at_once=at_once)
    assert settled.throttled and settled.reason == "429"


def test_classify_then_settle_in_one_call() -> None:
    policy = resolved(max_delay_s=60.0)
    outcome = policy.classify(batchrun.Retry("busy", delay_s=600.0), 0, at_once=True)
    assert (outcome.state, outcome.reason, outcome.delay_s) == (State.RETRYING, "busy", 60.0)
    assert policy.classify(batchrun.Fail("no"), 0, at_once=True).state is State.FAILED


def test_a_verdict_without_a_reason_has_its_own() -> None:
    """``Skip()`` was a TypeError (a missing argument), which the run took for a bug in
    the job and retried; the outcome each verdict means is the one a reason gives."""
    from batchrun.pipeline.outcomes import classify

    for verdict, state, reason in (
        (batchrun.Skip(), State.SKIPPED, "skipped by the job"),
        (batchrun.Retry(delay_s=5), State.RETRYING, "the job asked for a retry"),
        (batchrun.Fail(), State.FAILED, "failed by the job"),
        (batchrun.Fail("no such account"), State.FAILED, "no such account"),
        (batchrun.Busy(), State.RETRYING, "the backend is busy"),
    ):
        outcome = classify(verdict)
        assert (outcome.state, outcome.reason) == (state, reason)
    assert classify(batchrun.Retry(delay_s=5)).delay_s == 5


def test_an_http_timeout_says_where_it_was_going() -> None:
    """httpx's timeouts often carry no text: the reason `why` and `dead list` showed was
    "ReadTimeout: " and nothing after it."""
    import httpx

    from batchrun.pipeline.outcomes import classify

    request = httpx.Request("POST", "http://127.0.0.1:9/v1/charges?token=secret")
    outcome = classify(httpx.ReadTimeout("", request=request))
    assert outcome.state is State.RETRYING
    assert outcome.reason == "ReadTimeout: no answer from http://127.0.0.1:9/…/charges"
    said = classify(httpx.ConnectError("refused", request=request))
    assert said.reason == "ConnectError: refused"

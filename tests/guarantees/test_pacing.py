"""The pacer covers any effect, not only mail: ``--rate`` and the circuit breaker hold a
job that calls an HTTP API (examples/credits through its backend, ``ctx.http``), and the
pacer's feedback (AIMD on a 429, the breaker's gate) in unit tests (``ctx.paced()``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.cli import run_cli
from support.db import query
from support.http_server import GrantsTestServer
from support.job_cases import CreditsCase
from support.ports import free_port
from support.smtp_server import SmtpTestServer

import batchrun
from batchrun.pipeline.outcomes import EffectFail, EffectRetry, classify
from batchrun.policy.pacing import CircuitBreaker, Pacer, breaker_reason
from batchrun.policy.rate import AdaptiveRate

CREDITS_BREAKER = "backend 'credits' unreachable (circuit breaker open)"


@pytest.fixture
def case(smtp_server: SmtpTestServer, grants: GrantsTestServer) -> CreditsCase:
    grants.reset()
    return CreditsCase(smtp_server, grants)


def summary_of(result: Any) -> dict[str, Any]:
    assert result.stdout.strip(), result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# -- --rate over HTTP calls ----------------------------------------------------------------


def test_rate_20_holds_the_credits_job_to_20_calls_a_second(
    case: CreditsCase, grants: GrantsTestServer, sqlite_url: str
) -> None:
    entities = case.seed(sqlite_url, 60)
    result = case.cli(
        sqlite_url,
        "run",
        "credits",
        "--period",
        case.period,
        "--rate",
        "20",
        "--concurrency",
        "20",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    summary = summary_of(result)
    assert summary["succeeded"] == len(entities.want)
    per_second = grants.calls_per_second()
    assert sum(per_second) == len(entities.want) >= 50
    # A leaky bucket of 1 at 20/s: at most 20 starts in any second, plus the one the bucket
    # may hold at a boundary (AdaptiveRate's documented burst, 1 by default).
    assert max(per_second) <= 20 + 1, per_second
    figures = summary["backends"]["credits"]
    assert figures["calls"] == len(entities.want) and figures["throttles"] == 0
    assert 0 < figures["rate"] <= 20  # the backend's own auto rate, capped by --rate 20


# -- the breaker over HTTP calls -----------------------------------------------------------


def test_the_breaker_opens_when_the_credits_api_is_down(case: CreditsCase, sqlite_url: str) -> None:
    entities = case.seed(sqlite_url, 80)
    env = case.env(sqlite_url, BATCHRUN_BACKEND_CREDITS_URL=f"http://127.0.0.1:{free_port()}")
    result = run_cli(
        *case.args("run", "credits", "--period", case.period, "--concurrency", "4", "--json"),
        env=env,
    )
    assert result.returncode == 3, result.stderr
    summary = summary_of(result)
    # The backend's own breaker opened, and stopped the run as the mail backend's would.
    assert summary["stopped"] == CREDITS_BREAKER == breaker_reason("credits")
    assert summary["backends"]["credits"]["calls"] >= 5
    assert summary["succeeded"] == 0
    # Every selected customer is queued for retry (or was skipped before the breaker
    # opened: a plan with no credit): nothing lost.
    assert summary["queued_for_retry"] + summary["skipped"] == len(entities.selected)
    assert summary["queued_for_retry"] >= len(entities.want)
    errors = [str(e) for (e,) in query(sqlite_url, "SELECT last_error FROM batchrun_ledger")]
    tried = [e for e in errors if "ConnectError" in e]
    # The breaker's threshold (5) in a row, plus what was in flight: not one per customer.
    assert 5 <= len(tried) <= 5 + 4, errors
    assert sum(1 for e in errors if e == CREDITS_BREAKER) >= len(entities.want) - len(tried)


# -- the pacer, unit by unit ---------------------------------------------------------------


async def test_a_429_through_the_pacer_halves_the_rate_and_becomes_a_retry() -> None:
    import httpx

    limiter = AdaptiveRate(16.0, ceiling=16.0)
    pacer = Pacer(limiter, CircuitBreaker(5))
    request = httpx.Request("POST", "http://127.0.0.1:9/grants")
    response = httpx.Response(429, headers={"Retry-After": "2"}, request=request)
    with pytest.raises(batchrun.Retry) as raised:
        async with pacer.call():
            response.raise_for_status()
    assert isinstance(raised.value, EffectRetry)
    assert raised.value.delay_s == 2.0
    assert limiter.rate == 8.0 and pacer.throttles == 1
    assert classify(raised.value).throttled


async def test_a_connection_error_through_the_pacer_still_counts_for_the_breaker() -> None:
    import httpx

    pacer = Pacer(None, CircuitBreaker(5))
    with pytest.raises(batchrun.Retry) as raised:
        async with pacer.call():
            raise httpx.ConnectError("refused")
    outcome = classify(raised.value)
    assert outcome.connection and "ConnectError" in (outcome.reason or "")


async def test_a_4xx_through_the_pacer_fails_for_good() -> None:
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1:9/grants")
    with pytest.raises(batchrun.Fail) as raised:
        async with Pacer(None, CircuitBreaker(5)).call():
            httpx.Response(422, request=request).raise_for_status()
    assert isinstance(raised.value, EffectFail)
    assert "HTTP 422" in raised.value.reason


async def test_an_open_breaker_starts_no_call() -> None:
    breaker = CircuitBreaker(1)
    breaker.failure()
    pacer = Pacer(None, breaker)
    started = []
    with pytest.raises(batchrun.Retry, match="circuit breaker open"):
        async with pacer.call():
            started.append(1)
    assert started == [] and pacer.calls == 0


async def test_a_bug_inside_the_block_is_not_made_a_verdict() -> None:
    with pytest.raises(KeyError):
        async with Pacer(None, CircuitBreaker(5)).call():
            raise KeyError("a bug in the job")

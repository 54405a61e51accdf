"""The database URL's ``reply_timeout``: how long a statement waits for its reply."""

from __future__ import annotations

import asyncio

import pytest

from batchrun.db.server import REPLY_TIMEOUT_S, ReplyDeadline, reply_timeout
from batchrun.errors import ConfigError


def test_the_default_a_number_and_zero_for_never() -> None:
    assert reply_timeout("mysql://root@127.0.0.1/app") == REPLY_TIMEOUT_S == 60
    assert reply_timeout("postgresql://u@h/app?sslmode=require&reply_timeout=2.5") == 2.5
    assert reply_timeout("mysql://root@127.0.0.1/app?reply_timeout=0") is None


@pytest.mark.parametrize("bad", ["soon", "-1", "nan", "inf", "1e12"])
def test_a_bad_value_is_a_config_error_without_the_password(bad: str) -> None:
    with pytest.raises(ConfigError, match="bad reply_timeout") as caught:
        reply_timeout(f"mysql://app:hunter2@db/app?reply_timeout={bad}")
    assert "hunter2" not in str(caught.value)


async def test_the_deadline_closes_once_and_says_why_and_a_cancelled_one_never() -> None:
    closed: list[str] = []
    fired = ReplyDeadline(0.01, lambda: closed.append("fired"))
    kept = ReplyDeadline(0.01, lambda: closed.append("kept"))
    kept.cancel()
    never = ReplyDeadline(None, lambda: closed.append("never"))
    await asyncio.sleep(0.05)
    assert closed == ["fired"]
    assert (fired.expired, kept.expired, never.expired) == (True, False, False)
    lost = ConnectionError("lost")
    assert kept.explained(lost) is lost
    assert "no reply in 0.01 s" in str(fired.explained(lost))
    assert fired.explained(lost).__cause__ is lost

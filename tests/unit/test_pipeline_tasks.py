"""A task waiting for its entity's turn: how long it stays away from the queue, and that a
worker's ``--idle-exit`` waits for it to come back."""

from __future__ import annotations

import random
import time

import pytest

from batchrun.db.store import State
from batchrun.pipeline.apply import Disposition
from batchrun.pipeline.drain import count
from batchrun.pipeline.reports import RetrySummary
from batchrun.pipeline.tasks import TURN_WAIT_MAX_S, TURN_WAIT_S, turn_wait


@pytest.mark.parametrize(
    ("receives", "around_s"),
    [(1, TURN_WAIT_S), (2, 2 * TURN_WAIT_S), (4, 8 * TURN_WAIT_S), (30, TURN_WAIT_MAX_S)],
)
def test_the_wait_doubles_with_each_receive_up_to_the_cap(receives: int, around_s: float) -> None:
    random.seed(receives)
    delays = [turn_wait(receives).delay_s for _ in range(200)]
    assert all(0.5 * around_s <= d <= 1.5 * around_s for d in delays), (min(delays), max(delays))
    assert max(delays) - min(delays) > 0.1 * around_s, "jittered, so waiters do not meet again"


def test_a_wait_counts_nothing_and_keeps_the_message() -> None:
    wait = turn_wait(3)
    assert wait.action == "later"
    assert wait.counted is False, "waiting for the entity's turn is no outcome of its own"
    assert wait.keep is True, "kept on the queue with no receive counted toward redrive"


def test_a_first_receive_of_zero_is_the_first_wait() -> None:
    assert turn_wait(0).delay_s <= 1.5 * TURN_WAIT_S


def test_a_turn_wait_holds_a_workers_idle_exit_until_it_comes_back() -> None:
    result = RetrySummary()
    before = time.monotonic()
    wait = turn_wait(5)
    count(result, wait)
    assert before + wait.delay_s <= result.waiting_until <= time.monotonic() + wait.delay_s
    count(result, turn_wait(1))  # a shorter wait later does not pull it in
    assert result.waiting_until >= before + wait.delay_s
    assert "waiting_until" not in result.to_json(), "not a key of the JSON summary"


def test_a_retry_delay_does_not_hold_the_idle_exit() -> None:
    result = RetrySummary()
    count(result, Disposition("later", "try again", delay_s=3600.0, outcome=State.RETRYING))
    assert result.waiting_until == 0.0


def test_a_wait_for_a_retry_time_comes_back_just_after_it_and_holds_no_idle_exit() -> None:
    random.seed(7)
    waits = [turn_wait(1, retry_in_s=30.0) for _ in range(200)]
    assert all(30.0 <= w.delay_s <= 30.0 + TURN_WAIT_S for w in waits)
    assert all(w.keep and not w.counted for w in waits), "no receive counted toward redrive"
    result = RetrySummary()
    count(result, waits[0])
    assert result.waiting_until == 0.0, "as the task's own retry: no idle exit held"
    assert turn_wait(1, retry_in_s=-0.2).delay_s <= 1.5 * TURN_WAIT_S  # its time has come

"""One task's steps in its entity's story (control/task_story.py), from its stored row."""

from __future__ import annotations

from typing import Any

from batchrun.control.task_story import _steps
from batchrun.tasks.store import TaskState

NOW = 1_800_000_000_000


def row(state: TaskState, **times: Any) -> tuple[Any, ...]:
    """A story_tasks row: id, key, state, attempts, owner, lease_until, last_error, then
    created_at, started_at, finished_at, retry_at, resent_at, run_id."""
    return (
        1,
        "k1",
        int(state),
        times.get("attempts", 0),
        times.get("owner"),
        times.get("lease_until"),
        times.get("error"),
        NOW - 60_000,
        times.get("started"),
        times.get("finished"),
        times.get("retry_at"),
        times.get("resent_at"),
        times.get("run"),
    )


def told(r: tuple[Any, ...]) -> list[tuple[str, str]]:
    return [(e.what, e.detail) for e in _steps(r, NOW, NOW)]


def test_a_running_task_held_or_with_its_lease_ended() -> None:
    held = row(TaskState.RUNNING, attempts=1, owner="p1", lease_until=NOW + 5, started=NOW - 9)
    assert told(held)[-1] == ("task running", "key k1: attempt 2, a process holds it (p1)")
    ended = row(TaskState.RUNNING, owner="p1", lease_until=NOW - 1, started=NOW - 9)
    assert "lease has ended" in told(ended)[-1][1]


def test_a_pending_task_not_started_or_given_back() -> None:
    assert told(row(TaskState.PENDING))[-1] == ("task waiting", "key k1: not started yet")
    back = told(row(TaskState.PENDING, started=NOW - 9))
    assert [w for w, _ in back] == ["task submitted", "task started", "task waiting"]
    assert "given back unattempted" in back[-1][1]


def test_a_task_sent_again_then_failed_with_its_retry_time() -> None:
    steps = told(
        row(
            TaskState.FAILED,
            attempts=1,
            error="boom",
            started=NOW - 20,
            finished=NOW - 10,
            retry_at=NOW + 30_000,
            resent_at=NOW - 30,
        )
    )
    assert [w for w, _ in steps] == [
        "task submitted",
        "task sent again",
        "task started",
        "task failed",
    ]
    assert (
        steps[-1][1]
        == "key k1, 1 attempt, last error: boom; tried again from 2027-01-15T08:00:30.000Z"
    )


def test_a_failed_task_given_back_unattempted_and_a_dead_one_without_an_error() -> None:
    back = told(row(TaskState.FAILED, attempts=1, error="boom", started=NOW - 5, finished=NOW - 10))
    assert [w for w, _ in back][-2:] == ["task failed", "task waiting"]
    assert "given back unattempted" in back[-1][1]
    dead = told(row(TaskState.DEAD, attempts=3, started=NOW - 20, finished=NOW - 10))
    assert dead[-1] == ("task dead", "key k1, for good after 3 attempts: ?")


def runs(r: tuple[Any, ...]) -> dict[str, int | None]:
    return {e.what: e.run_id for e in _steps(r, NOW, NOW)}


def test_the_run_that_started_a_task_is_its_start_and_its_ends() -> None:
    """The row's run_id is the run of its last start and of the end that start led to; a
    submission is no run's; a start after the end (given back) leaves the end to time."""
    done = runs(row(TaskState.SUCCEEDED, attempts=1, started=NOW - 20, finished=NOW - 10, run=7))
    assert done == {"task submitted": None, "task started": 7, "task succeeded": 7}
    dead = runs(row(TaskState.DEAD, attempts=3, started=NOW - 20, finished=NOW - 10, run=8))
    assert (dead["task started"], dead["task dead"]) == (8, 8)
    held = runs(row(TaskState.RUNNING, owner="p1", lease_until=NOW + 5, started=NOW - 9, run=9))
    assert held["task running"] == 9
    back = runs(row(TaskState.FAILED, attempts=1, started=NOW - 5, finished=NOW - 10, run=4))
    assert (back["task started"], back["task failed"]) == (4, None)
    old = runs(row(TaskState.SUCCEEDED, attempts=1, started=NOW - 20, finished=NOW - 10))
    assert old["task succeeded"] is None  # written before run_id: told by time

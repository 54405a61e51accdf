"""A task job's entity in ``batchrun why`` and the dashboard: its submitted tasks.

A task job has no page and no ledger: what became of an entity is in its rows of
``batchrun_entity_task``. Each task gives up to four steps, from the times stored there:
submitted (``created_at``), sent again because its message looked lost (``resent_at``),
started (``started_at``, the last start only), and its end (``finished_at``: succeeded,
failed and waiting for its retry time, or dead), or that it runs now. The run of the last
start and of the end it led to is the row's ``run_id`` (the worker, Lambda invocation or
drain that started it); a row written before that column is told by time (story.py). The entity is
"eligible" while one of its tasks is unfinished; its state is that of the task whose
turn it is (its oldest unfinished one, told even when older than the newest
``MAX_TASKS``), else of its newest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchrun.control.timeline import Event, iso
from batchrun.db.base import Database
from batchrun.tasks.store import TaskState

MAX_TASKS = 100  # an entity's newest tasks told
NAMES = {state: state.name.lower() for state in TaskState}
# Steps no run took: a submission (an application's), and what is true now.
NOT_BY_A_RUN = ("task submitted", "task waiting", "no task", "older tasks")


async def task_events(
    db: Database, job: str, entity_id: int, now: int
) -> tuple[bool, str | None, list[Event]]:
    """(eligible, state, events) of ``entity_id``'s tasks for task job ``job``."""
    rows = await db.fetchall("story_tasks", job=job, id=entity_id, limit=MAX_TASKS)
    if not rows:
        return False, None, [Event(now, "no task", "none submitted for this entity")]
    current = await db.fetchone("story_task_current", job=job, id=entity_id)
    if current is not None and all(int(r[0]) != int(current[0]) for r in rows):
        rows.append(current)  # older than the newest told, and what the rest wait behind
    clock = await db.clock_ms()  # the server's, which the leases are on
    # Oldest first: the sort by time is stable, so tasks of one moment (submit_many's, in
    # one millisecond) keep their submission order.
    events = [e for row in sorted(rows, key=lambda r: int(r[0])) for e in _steps(row, now, clock)]
    if len(rows) >= MAX_TASKS:
        told = "the newest" + (" and the one whose turn it is" if len(rows) > MAX_TASKS else "")
        events.append(Event(now, "older tasks", f"not told: only {told} {MAX_TASKS}"))
    state = TaskState(int((current or rows[0])[2]))
    return current is not None, NAMES[state], events


def _steps(row: Sequence[Any], now: int, clock: int) -> list[Event]:
    """One task's steps; ``now`` is this process's clock, ``clock`` the server's."""
    key, state, attempts, owner, lease_until, error = row[1], TaskState(int(row[2])), *row[3:7]
    created, started, finished, retry_at, resent_at, run = (
        None if v is None else int(v) for v in row[7:13]
    )
    tries = f"{attempts} attempt{'s' if int(attempts) != 1 else ''}"
    out = [Event(int(created or 0), "task submitted", f"key {key}")]
    if resent_at is not None:
        out.append(Event(resent_at, "task sent again", f"key {key}: its message looked lost"))
    if state is TaskState.RUNNING:
        if lease_until is not None and int(lease_until) > clock:
            detail = f"key {key}: attempt {int(attempts) + 1}, a process holds it ({owner})"
        else:
            detail = f"key {key}: its process's lease has ended; the next delivery takes it over"
        out.append(Event(started or now, "task running", detail, run))
        return out
    if started is not None:
        out.append(Event(started, "task started", f"key {key}: its last start", run))
    if started is not None and finished is not None and started > finished:
        run = None  # started again after its end, and given back: its end's run is told by time
    if state is TaskState.PENDING:
        why = "not started yet" if started is None else "given back unattempted (busy, or a stop)"
        out.append(Event(now, "task waiting", f"key {key}: {why}"))
    elif state is TaskState.SUCCEEDED:
        out.append(Event(finished or now, "task succeeded", f"key {key}, after {tries}", run))
    elif state is TaskState.DEAD:
        detail = f"key {key}, for good after {tries}: {error or '?'}"
        out.append(Event(finished or now, "task dead", detail, run))
    else:  # failed: waits for its next attempt
        again = "" if retry_at is None else f"; tried again from {iso(retry_at)}"
        detail = f"key {key}, {tries}, last error: {error or '?'}{again}"
        out.append(Event(finished or now, "task failed", detail, run))
        if started is not None and finished is not None and started > finished:
            back = f"key {key}: given back unattempted (busy, or a stop); another attempt waits"
            out.append(Event(now, "task waiting", back))
    return out

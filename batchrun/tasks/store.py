"""The tasks' tables: submissions (``batchrun_entity_task``), one row per (job, key), and
whose turn it is per entity (``batchrun_entity_turn``), a lease held while a task runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from batchrun.chunks import chunks
from batchrun.db.base import Database
from batchrun.db.clock import server_clock

TURNS_A_STATEMENT = 500  # entities whose turn rows one statement adds


class TaskState(IntEnum):
    PENDING = 0
    RUNNING = 1
    SUCCEEDED = 2
    FAILED = 3  # the last attempt failed: waits for another
    DEAD = 4  # given up for good

    @property
    def final(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.DEAD)


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: int
    entity_id: int
    data: dict[str, Any]
    state: TaskState
    attempts: int
    retry_at: int | None = None  # a failed task starts again no earlier (server ms)


@dataclass(frozen=True, slots=True)
class Submission:
    """What a key's row tells a resubmission of it: its entity, and whether its message
    could look lost (``tasks/resend.py``). Times in server ms."""

    entity_id: int
    unstarted: bool  # pending and never started by any process
    created_at: int

    def settled(self, cutoff: int) -> bool:
        """Whether its message cannot look lost at ``cutoff``: it started once (a task
        that ever started is never sent again), or was submitted at or after ``cutoff``.
        One sent again lately is not taken as settled: that resend may be being undone
        (``task_unclaim_resend``), and ``resend_if_lost`` looks at it as it stands."""
        return not self.unstarted or self.created_at >= cutoff


class TaskStore:
    """Submissions and turns over batchrun's database; ``me`` fences every write."""

    def __init__(self, db: Database, run_id: int | None = None) -> None:
        self.db = db
        # Submission and end times on the server's clock, which a lost task's age and the
        # leases are told on: a submitter whose clock is minutes off adds no twin.
        self.clock = server_clock(db)
        self.run_id = run_id  # the batchrun_run row a start records (``why`` names it)

    async def submit(self, job: str, entity_id: int, key: str, data: str) -> bool:
        """Record a submission; False when its key was already submitted (nothing changes)."""
        await self.add_turns(job, [entity_id])
        return await self.add(job, entity_id, key, data)

    async def add_turns(self, job: str, entities: Sequence[int]) -> None:
        """The turn rows of ``entities`` (their tasks' order), where there are none yet."""
        for some in chunks(entities, TURNS_A_STATEMENT):
            rows = [(job, entity, None, 0) for entity in some]
            await self.db.execute("turn_insert", rows=rows)

    async def add(self, job: str, entity_id: int, key: str, data: str) -> bool:
        """The submission's row, once its entity's turn row is there (``add_turns``);
        False when its key was already submitted (nothing changes).

        An insert whose reply was lost goes again, and finds the row its first run may
        have written: that row is this submission's (same entity, never started, written
        at this very millisecond), not an earlier one's, and its message is still to send.
        """
        now = await self.clock.now_ms()
        added, reran = await self.db.execute_reran(
            "task_insert", job=job, key=key, entity_id=entity_id, data=data, now=now
        )
        if added > 0 or not reran:
            return added > 0
        row = (await self.submitted_many(job, [key])).get(key)
        return (
            row is not None
            and row.entity_id == entity_id
            and row.unstarted
            and (row.created_at == now)
        )

    async def withdraw(self, job: str, keys: list[str]) -> int:
        """Take back the submissions of ``keys`` (at most a few hundred) that no process
        has started (their messages were never sent), in one statement; how many."""
        if not keys:
            return 0
        return await self.db.execute("task_withdraw", job=job, keys=keys)

    async def claim_resend(self, job: str, key: str, now: int, cutoff: int) -> bool:
        """Whether this process is to send ``key``'s message again: its task was never
        started, submitted before ``cutoff`` (ms) and not sent again since (one process
        wins each period). ``now`` and ``cutoff`` are on the database's clock."""
        claimed = await self.db.execute(
            "task_claim_resend", job=job, key=key, now=now, cutoff=cutoff
        )
        return claimed > 0

    async def unclaim_resend(self, job: str, key: str, now: int) -> None:
        """Undo ``claim_resend`` (made at ``now``): its message could not be sent."""
        await self.db.execute("task_unclaim_resend", job=job, key=key, now=now)

    async def lost_firsts(self, job: str, entities: list[int], cutoff: int) -> dict[int, str]:
        """Of ``entities``, the oldest unfinished tasks that look lost, and were already
        their entity's oldest at ``cutoff`` (no task of it ended since): key by entity."""
        if not entities:
            return {}
        rows = await self.db.fetchall("task_lost_firsts", job=job, ids=entities, cutoff=cutoff)
        return {int(r[0]): str(r[1]) for r in rows}

    async def unstarted_slice(
        self, job: str, after: int, cutoff: int, limit: int
    ) -> tuple[int, int, list[tuple[int, str]]]:
        """The job's next ``limit`` never-started tasks after id ``after``: how many were
        read, the last id read, and those that look lost at ``cutoff`` (entity, key)."""
        rows = await self.db.fetchall(
            "task_unstarted_slice", job=job, after=after, cutoff=cutoff, limit=limit
        )
        lost = [(int(r[1]), str(r[2])) for r in rows if int(r[3])]
        return len(rows), int(rows[-1][0]) if rows else after, lost

    async def get(self, job: str, key: str) -> TaskRow | None:
        row = await self.db.fetchone("task_get", job=job, key=key)
        if row is None:
            return None
        data = json.loads(row[2])
        state, attempts = TaskState(int(row[3])), int(row[4])
        return TaskRow(int(row[0]), int(row[1]), data, state, attempts, _ms(row[7]))

    async def take_turn(self, job: str, entity_id: int, me: str, lease_s: float) -> bool:
        """Hold the entity's turn (a lease on the server's clock); False while another
        live process holds it."""
        now = await self.db.clock_ms()
        taken = await self.db.execute(
            "turn_take",
            job=job,
            entity_id=entity_id,
            me=me,
            until=now + int(lease_s * 1000),
            now=now,
        )
        return taken > 0

    async def first_unfinished(self, job: str, entity_id: int) -> str | None:
        """The key of the entity's oldest task not finished: the one whose turn it is."""
        row = await self.db.fetchone("task_first_unfinished", job=job, entity_id=entity_id)
        return None if row is None else str(row[0])

    async def start(self, task_id: int, me: str, lease_s: float) -> bool:
        """Mark the task running, leased to ``me``; False while another live process runs
        it, or before a failed task's ``retry_at``."""
        now = await self.db.clock_ms()
        until = now + int(lease_s * 1000)
        started = await self.db.execute(
            "task_start", id=task_id, me=me, until=until, now=now, run=self.run_id
        )
        return started > 0

    async def extend_task(self, task_id: int, me: str, until: int) -> bool:
        """Extend the task's lease to ``until`` (server ms); False when it is not ``me``'s."""
        return await self.db.execute("task_extend", id=task_id, me=me, until=until) > 0

    async def extend_turn(self, job: str, entity_id: int, me: str, until: int) -> bool:
        """Extend the entity's turn to ``until`` (server ms); False when it is not ``me``'s."""
        changed = await self.db.execute(
            "turn_extend", job=job, entity_id=entity_id, me=me, until=until
        )
        return changed > 0

    async def finish(
        self,
        task_id: int,
        me: str,
        state: TaskState,
        error: str | None,
        retry_at: int | None = None,
    ) -> bool:
        """Record the attempt's end, and for a failed one the time (server ms) before which
        it may not start again; False when the lease was lost (nothing recorded)."""
        done = await self.db.execute(
            "task_finish",
            id=task_id,
            me=me,
            state=int(state),
            error=None if error is None else error[:500],
            now=await self.clock.now_ms(),
            retry_at=retry_at,
        )
        return done > 0

    async def release(self, task_id: int, me: str) -> None:
        """Give a started task back unattempted (stopped first, or its backend was busy):
        pending again, or waiting for its retry, its attempts as they were."""
        await self.db.execute("task_release", id=task_id, me=me)

    async def release_turn(self, job: str, entity_id: int, me: str) -> None:
        await self.db.execute("turn_release", job=job, entity_id=entity_id, me=me)

    # -- a batch at once (pipeline/task_claim.py) -----------------------------------------

    async def get_many(self, job: str, keys: list[str]) -> dict[str, TaskRow]:
        """The tasks of ``keys`` that exist, by key."""
        rows = await self.db.fetchall("task_get_many", job=job, keys=keys) if keys else []
        return {
            str(r[5]): TaskRow(
                int(r[0]), int(r[1]), json.loads(r[2]), TaskState(int(r[3])), int(r[4]), _ms(r[6])
            )
            for r in rows
        }

    async def submitted_many(self, job: str, keys: list[str]) -> dict[str, Submission]:
        """The submissions of ``keys`` that exist, by key, as a resubmission sees them."""
        rows = await self.db.fetchall("task_submitted_many", job=job, keys=keys) if keys else []
        return {str(r[0]): Submission(int(r[1]), bool(int(r[2])), int(r[3])) for r in rows}

    async def take_turns(
        self, job: str, entities: list[int], me: str, until: int, now: int
    ) -> set[int]:
        """Hold the turns of ``entities`` that no other live process holds; those held."""
        if not entities:
            return set()
        params = {"job": job, "ids": entities, "me": me}
        await self.db.execute("turn_take_many", **params, until=until, now=now)
        return {int(r[0]) for r in await self.db.fetchall("turn_mine", **params)}

    async def first_unfinished_ids(self, job: str, entities: list[int]) -> dict[int, int]:
        """Each entity's oldest unfinished task's id, by entity."""
        if not entities:
            return {}
        rows = await self.db.fetchall("task_first_unfinished_many", job=job, ids=entities)
        return {int(r[0]): int(r[1]) for r in rows}

    async def start_many(self, ids: list[int], me: str, until: int, now: int) -> set[int]:
        """Mark the tasks running, leased to ``me`` (as ``start``); those this process now
        runs."""
        if not ids:
            return set()
        await self.db.execute(
            "task_start_many", ids=ids, me=me, until=until, now=now, run=self.run_id
        )
        return {int(r[0]) for r in await self.db.fetchall("task_mine", ids=ids, me=me)}

    async def finish_many(self, ids: list[int], me: str, state: TaskState) -> set[int]:
        """``finish`` without an error for each of ``ids``; the ids whose end was recorded
        (the others' lease was lost)."""
        if not ids:
            return set()
        now = await self.clock.now_ms()
        done = await self.db.execute("task_finish_many", ids=ids, me=me, state=int(state), now=now)
        if done >= len(ids):
            return set(ids)
        # Fewer changed than named (a lease lost, or the statement went again after a lost
        # connection): the ones recorded are those with this very end. Another process
        # ending the same task alike in the same millisecond would pass for this one: its
        # message is then deleted rather than looked at again, the task final either way.
        rows = await self.db.fetchall("task_finished_at", ids=ids, state=int(state), now=now)
        return {int(r[0]) for r in rows}

    async def release_turns(self, job: str, entities: list[int], me: str) -> None:
        if entities:
            await self.db.execute("turn_release_many", job=job, ids=entities, me=me)

    async def counts(self, job: str) -> dict[str, Any]:
        """``status TASKJOB``: tasks per state now, and how long the oldest has waited."""
        counts: dict[str, Any] = {state.name.lower(): 0 for state in TaskState}
        oldest: int | None = None
        now = await self.clock.now_ms()
        stale = 0
        for state, n, first, dead in await self.db.fetchall("task_counts", job=job, now=now):
            counts[TaskState(int(state)).name.lower()] = int(n)
            if int(state) == TaskState.PENDING and first is not None:
                oldest = int(first)
            if int(state) == TaskState.RUNNING:
                stale = int(dead or 0)
        # A task whose process died is not running: it starts again once its message
        # comes back (a period's status says claimed_by_stopped_run of its entities too).
        counts["running"] -= stale
        counts["claimed_by_stopped_run"] = stale
        counts["oldest_pending_s"] = (
            None if oldest is None else round(max(0, now - oldest) / 1000, 1)
        )
        return counts


def _ms(value: Any) -> int | None:
    return None if value is None else int(value)

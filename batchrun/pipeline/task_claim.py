"""What a process holds while it runs submitted tasks, and how a batch takes it.

``TaskClaims``: the tasks this process runs (their leases) and the entities' turns it
holds, all on the database server's clock and kept alive by one heartbeat (a ``Fence``).

``first_wave``: a batch's first tasks claimed at once, each entity's first message of the
batch, in a fixed number of statements whatever the batch's size (``TaskRoad`` runs the
rest of an entity's messages one at a time, ``TaskRoad._next``). The conditions are those
of the one-task path, each a set-wise statement: the task rows (one read), the entities'
turns (one update, one read of those now held), each entity's oldest unfinished task (one
read: only that one may start), the starts (one update, one read of those now leased to
this process). A message whose task is missing or finished is left to the one-task path
(poison, or deleted); one whose entity is another process's turn, or not its turn yet, or
whose task another live process runs or failed and may not start again yet (its
``retry_at``), waits with the rest of its entity's messages (no attempt counted), its
entity's turn let go.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

from batchrun.control.steering import Steering
from batchrun.db.store import Scope
from batchrun.pipeline.apply import Disposition
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.item import Item
from batchrun.pipeline.lease import Fence
from batchrun.queue.base import QueueMessage, Received
from batchrun.task import Task
from batchrun.tasks.store import TaskRow, TaskStore

Entry = tuple[Received, QueueMessage]
Holder = tuple[str, int]
log = logging.getLogger(__name__)


class TaskClaims(Fence):
    """The tasks of ``job`` this process runs (their leases) and the entities' turns it
    holds. A task job is paused and cancelled as a whole (period '')."""

    def __init__(
        self,
        store: TaskStore,
        job: str,
        *,
        lease_s: float,
        stop: StopToken,
        steering: Steering | None = None,
    ) -> None:
        super().__init__(lease_s=lease_s, stop=stop, steering=steering)
        self.store = store
        self.running: dict[int, tuple[str, int]] = {}  # task id -> (job, entity id)
        self.turns: set[tuple[str, int]] = set()  # (job, entity id)
        self._lost: set[int] = set()
        self._job = [Scope(job, "", "")]
        # What `batchrun cancel JOB` names: the tasks' batch stops as a run's would.
        self._scopes.add(self._job[0])

    def holding(self) -> bool:
        return bool(self.running or self.turns)

    def held_scopes(self) -> Iterable[Scope]:
        # The job's, while it holds a task (serial "none": no turn) or a turn; asked before
        # each task starts, so a pause holds the batch's next ones whatever its size.
        return self._job if self.running or self.turns else ()

    def lost(self, item: Item) -> bool:
        return item.task_id in self._lost

    async def renew_held(self) -> None:
        until = await self.store.db.clock_ms() + self.lease_ms
        for job, entity in list(self.turns):
            if not await self.store.extend_turn(job, entity, self.me, until):
                self.turns.discard((job, entity))
                mine = [t for t, held in self.running.items() if held == (job, entity)]
                self._lose(mine, f"{job}: entity {entity}'s turn")
        for task_id in list(self.running):
            if not await self.store.extend_task(task_id, self.me, until):
                self._lose([task_id], f"task {task_id}")

    def _lose(self, task_ids: list[int], what: str) -> None:
        for task_id in task_ids:
            self.running.pop(task_id, None)
            self._lost.add(task_id)
        if task_ids:
            self.lost_claims += len(task_ids)
            log.warning("%s was taken over by another process (this one's lease expired)", what)


async def first_wave(
    store: TaskStore,
    job: Task,
    groups: dict[int, deque[Entry]],
    *,
    me: str,
    lease_ms: int,
    turns: set[Holder],
    running: dict[int, Holder],
    found: dict[str, Disposition],
    wait: Callable[[int, float], Disposition],
    item: Callable[[Task, TaskRow, Received, QueueMessage], Item],
) -> dict[int, Item | None]:
    """Start each entity's first task of the batch; by entity, its started item, or None
    when its messages all wait (each with its disposition in ``found``). An entity left out
    is for the one-task path. ``turns`` and ``running`` are the claims' (updated)."""
    firsts = {entity: group[0] for entity, group in groups.items() if group}
    rows = await store.get_many(job.name, sorted({m.key for _, m in firsts.values()}))
    ready: dict[int, TaskRow] = {}
    for entity, (_, message) in firsts.items():
        row = rows.get(message.key)
        if row is not None and row.entity_id == message.entity_id and not row.state.final:
            ready[entity] = row
    if not ready:
        return {}
    now = await store.db.clock_ms()
    until = now + lease_ms
    candidates = dict(ready)
    if job.serial == "entity":
        taken = await store.take_turns(job.name, sorted(ready), me, until, now)
        turns.update((job.name, entity) for entity in taken)
        oldest = await store.first_unfinished_ids(job.name, sorted(taken))
        candidates = {e: r for e, r in ready.items() if e in taken and oldest.get(e) == r.id}
    started = await store.start_many(sorted(r.id for r in candidates.values()), me, until, now)
    wave: dict[int, Item | None] = {}
    let_go: list[int] = []
    for entity, row in ready.items():
        group = groups[entity]
        if row.id in started:
            received, message = group.popleft()
            running[row.id] = (job.name, entity)
            wave[entity] = item(job, row, received, message)
            continue
        # Not its turn, another process runs it, or its retry time has not come: all wait,
        # a message of that task until then, any other its turn.
        retry_in_s = 0.0 if row.retry_at is None else (row.retry_at - now) / 1000
        refused = group[0][1].key  # the task of ``row``
        for received, message in group:
            ahead = retry_in_s if message.key == refused else 0.0
            found.setdefault(received.message_id, wait(received.receive_count, ahead))
        group.clear()
        wave[entity] = None
        if (job.name, entity) in turns:
            turns.discard((job.name, entity))
            let_go.append(entity)
    await store.release_turns(job.name, sorted(let_go), me)
    return wave

"""``submit_many``: many tasks of one job in one statement each and a queue call per ten;
each key still once, in submission order per entity, and on an error the tasks whose
message was not sent taken back, so that submitting the same tasks again finishes the job.
On SQLite, MariaDB and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

import pytest
from support.cli import run_cli
from support.tasks import JOBS, RefusingQueue, StepsTask, effects, migrate_task_jobs

import batchrun
from batchrun.db import clock as clock_module
from batchrun.db.clock import server_clock
from batchrun.errors import QueueError
from batchrun.queue.base import WorkQueue
from batchrun.queue.local import LocalQueue
from batchrun.tasks import BadTask
from batchrun.tasks.store import TaskStore
from batchrun.tasks.submit import SEND_BATCH, submit_many


class PartlyQueue:
    """Queues every message but those at ``refused`` positions of a call, and says which."""

    def __init__(self, queue: WorkQueue, refused: tuple[int, ...]) -> None:
        self.queue = queue
        self.refused = refused

    async def send(self, bodies: list[str], *, delay_s: float = 0.0) -> None:
        await self.queue.send([b for i, b in enumerate(bodies) if i not in self.refused])
        error = QueueError("2 of 10 messages not queued (InternalError: x)")
        error.unsent = self.refused
        raise error


class CountingQueue:
    """The store's own queue, counting the sends; ``refuse_from``: the send of that
    number (1-based) and the later ones fail as an unreachable queue's do."""

    def __init__(self, queue: WorkQueue, refuse_from: int | None = None) -> None:
        self.queue = queue
        self.refuse_from = refuse_from
        self.sends: list[list[str]] = []

    async def send(self, bodies: list[str], *, delay_s: float = 0.0) -> None:
        if self.refuse_from is not None and len(self.sends) + 1 >= self.refuse_from:
            await RefusingQueue().send(bodies)
        self.sends.append(list(bodies))
        await self.queue.send(bodies, delay_s=delay_s)


async def _submit_telling(
    store: Any, queue: object, tasks: list[tuple[object, object, object]], told: list[str]
) -> None:
    """``submit_many`` of steps tasks, the keys ``on_sent`` is told appended to ``told``."""
    await submit_many(
        store.db,
        cast(WorkQueue, queue),
        StepsTask(),
        tasks,
        resend_after_s=300,
        on_sent=lambda settled: told.extend(d.key for d in settled),
    )


def _keys(sends: list[list[str]]) -> list[str]:
    return [str(json.loads(body)["key"]) for batch in sends for body in batch]


def test_many_tasks_run_once_each_in_submission_order(db_url: str) -> None:
    env = migrate_task_jobs(db_url)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        before = client.submit("steps", 3, data={"seq": 0}, key="e3-0")
        tasks: list[Any] = [(uid, {"seq": n}, f"e{uid}-{n}") for n in range(5) for uid in (1, 2, 3)]
        tasks += [(1, {"seq": 9}, "e1-0"), (4, None)]  # a repeat in the batch; a keyless one
        done = client.submit_many("steps", tasks)
        with pytest.raises(BadTask, match="JSON object"):
            client.submit_many("steps", [(5, {"seq": 1}, "ok"), (5, [1], "bad")])
        with pytest.raises(BadTask, match=r"\(entity_id, data\)"):
            client.submit_many("steps", [(5,)])  # type: ignore[list-item]
        with pytest.raises(BadTask, match="unknown job"):
            client.submit_many("nope", [(5, None)])
    assert before == "e3-0"
    assert [d.key for d in done[:-1]] == [t[2] for t in tasks[:-1]]  # in order, keys kept
    queued = [d.queued for d in done]
    assert queued == [t[2] != "e3-0" for t in tasks[:-2]] + [False, True], queued
    assert done[-1].entity_id == 4 and len(done[-1].key) == 32  # a key made for it
    pending = json.loads(run_cli("status", "steps", "--json", env=env).stdout)["pending"]
    assert pending == 16  # 15 of the batch and the one before it; nothing of the bad ones
    served = run_cli("worker", "--idle-exit", "1", "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    ran = effects(db_url)
    assert sorted(r[1] for r in ran) == sorted({*(t[2] for t in tasks[:-1]), done[-1].key})
    order: dict[int, list[int]] = defaultdict(list)
    for entity, _key, seq, _start, _end in sorted(ran, key=lambda r: r[3]):
        order[int(entity)].append(int(seq))
    assert order[1] == order[2] == order[3] == [0, 1, 2, 3, 4], dict(order)


async def test_a_queue_call_per_ten_and_a_statement_per_task(store: Any) -> None:
    queue = CountingQueue(LocalQueue(store.db))
    names: list[str] = []
    execute, execute_reran = store.db.execute, store.db.execute_reran
    inside: list[str] = []  # one calls the other (which, by database): one statement

    async def counted(name: str, **params: Any) -> int:
        if not inside:
            names.append(name)
        inside.append(name)
        try:
            return cast(int, await execute(name, **params))
        finally:
            inside.pop()

    async def counted_reran(name: str, **params: Any) -> tuple[int, bool]:
        if not inside:
            names.append(name)
        inside.append(name)
        try:
            return cast(tuple[int, bool], await execute_reran(name, **params))
        finally:
            inside.pop()

    store.db.execute, store.db.execute_reran = counted, counted_reran
    tasks: list[tuple[object, object, object]] = [(n % 7 + 1, {"n": n}, f"k{n}") for n in range(25)]
    try:
        done = await submit_many(
            store.db, cast(WorkQueue, queue), StepsTask(), tasks, resend_after_s=300
        )
    finally:
        store.db.execute, store.db.execute_reran = execute, execute_reran
    assert all(d.queued for d in done) and [len(s) for s in queue.sends] == [10, 10, 5]
    assert _keys(queue.sends) == [f"k{n}" for n in range(25)]
    # A row per task and the seven entities' turn rows at once; the rest is the table
    # queue's own statement per call.
    assert (names.count("task_insert"), names.count("turn_insert")) == (25, 1)
    assert len(names) == 26 + len(queue.sends), names
    assert SEND_BATCH == 10


async def test_a_failed_send_takes_back_only_the_unsent(store: Any) -> None:
    """The second queue call fails: the ten sent stay, the other fifteen are taken back;
    the same tasks submitted again queue those fifteen and leave the ten as they were."""
    tasks: list[tuple[object, object, object]] = [(n % 3 + 1, {"n": n}, f"k{n}") for n in range(25)]
    failing = CountingQueue(LocalQueue(store.db), refuse_from=2)
    with pytest.raises(QueueError, match="refused"):
        await _submit_telling(store, failing, tasks, told := [])  # told: what went
    rows = TaskStore(store.db)
    kept = [n for n in range(25) if await rows.get("steps", f"k{n}") is not None]
    assert kept == list(range(10)) and _keys(failing.sends) == [f"k{n}" for n in range(10)]
    assert told == [f"k{n}" for n in range(10)]
    again = CountingQueue(LocalQueue(store.db))
    done = await submit_many(
        store.db, cast(WorkQueue, again), StepsTask(), tasks, resend_after_s=300
    )
    assert [d.queued for d in done] == [False] * 10 + [True] * 15
    assert _keys(again.sends) == [f"k{n}" for n in range(10, 25)]


async def test_what_the_queue_took_of_a_failed_call_stays(store: Any) -> None:
    """A queue that says which messages of a call it did not take (SQS's Failed entries):
    only those rows are taken back; the rest stay, their messages queued."""
    queue = PartlyQueue(LocalQueue(store.db), refused=(1, 3))
    tasks: list[tuple[object, object, object]] = [(n + 1, None, f"k{n}") for n in range(10)]
    with pytest.raises(QueueError):  # told: what stays of the failed call, what went
        await _submit_telling(store, queue, tasks, told := [])
    rows = TaskStore(store.db)
    kept = [n for n in range(10) if await rows.get("steps", f"k{n}") is not None]
    assert kept == [0, 2, *range(4, 10)] and told == [f"k{n}" for n in kept]
    queued = [r.body for r in await LocalQueue(store.db).receive(max_messages=20, visibility_s=60)]
    assert sorted(json.loads(b)["key"] for b in queued) == [f"k{n}" for n in kept]


async def test_a_second_cancel_while_taking_back_leaves_no_row_without_its_message(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while the queue call hangs (a request handler whose client went
    away), and cancelled again while the rows are taken back. They were deleted one at a
    time, and the second cancel left nine recorded with no message: never run until the
    lost-task sweep, their entities' later tasks held behind them. Now one statement,
    which a cancel does not cut short."""
    sending, withdrawing = asyncio.Event(), asyncio.Event()

    class HangingQueue:
        async def send(self, bodies: list[str], *, delay_s: float = 0.0) -> None:
            sending.set()
            await asyncio.Event().wait()

    execute = store.db.execute

    async def noticed(name: str, **params: Any) -> int:
        if name == "task_withdraw":
            withdrawing.set()
        return cast(int, await execute(name, **params))

    monkeypatch.setattr(store.db, "execute", noticed)
    tasks: list[tuple[object, object, object]] = [(n + 1, None, f"k{n}") for n in range(10)]
    submitting = asyncio.create_task(
        submit_many(
            store.db, cast(WorkQueue, HangingQueue()), StepsTask(), tasks, resend_after_s=300
        )
    )
    await sending.wait()
    submitting.cancel()
    await withdrawing.wait()
    submitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await submitting
    rows = TaskStore(store.db)
    for _ in range(100):  # the withdrawal goes on after the caller stopped waiting for it
        kept = [n for n in range(10) if await rows.get("steps", f"k{n}") is not None]
        if not kept:
            break
        await asyncio.sleep(0.05)
    assert kept == []


async def test_a_resubmission_looks_for_lost_messages_only_where_one_could_be(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same tasks submitted again: a key submitted moments ago, or started once, is a
    no-op for its insert alone, with one clock read per queue call of keys never started;
    only a key that looks lost (never started, old) goes through the resend's look, and
    its message is sent again."""
    steps, rows = StepsTask(), TaskStore(store.db)
    tasks: list[tuple[object, object, object]] = [(n % 3 + 1, {"n": n}, f"k{n}") for n in range(12)]
    await submit_many(store.db, LocalQueue(store.db), steps, tasks, resend_after_s=60)
    assert await rows.submit("steps", 4, "lost", "{}")  # its submitter died before sending
    await store.db.execute_sql(
        "UPDATE batchrun_entity_task SET created_at = created_at - 3600000"
        " WHERE task_key IN ('lost', 'k0')",
        (),
    )
    started = await rows.get("steps", "k0")  # old as well, but it ran once
    assert started is not None and await rows.start(started.id, "A", 30.0)
    await rows.release(started.id, "A")
    # Old and never started, but sent again a moment ago by another process: its resend
    # may yet be undone, so the resend's own look decides (no: sent this period).
    assert await rows.submit("steps", 6, "resent", "{}")
    await store.db.execute_sql(
        "UPDATE batchrun_entity_task SET created_at = created_at - 3600000"
        " WHERE task_key = 'resent'",
        (),
    )
    now = await store.db.clock_ms()
    assert await rows.claim_resend("steps", "resent", now, now - 60_000)
    # The task store's own clock (db/clock.py) measured afresh, good for the whole test:
    # the reads counted below are submit_many's.
    monkeypatch.setattr(clock_module, "SLOW_READ_MS", 10**9)
    clock_module._CLOCKS.pop(store.db, None)
    await server_clock(store.db).now_ms()
    looks: list[str] = []
    clock, claim = store.db.clock_ms, TaskStore.claim_resend

    async def clock_read() -> int:
        looks.append("clock")
        return cast(int, await clock())

    async def claimed(self: TaskStore, job: str, key: str, now: int, cutoff: int) -> bool:
        looks.append(f"claim {key}")
        return await claim(self, job, key, now, cutoff)

    monkeypatch.setattr(store.db, "clock_ms", clock_read)
    monkeypatch.setattr(TaskStore, "claim_resend", claimed)
    again = CountingQueue(LocalQueue(store.db))
    resubmitted = [*tasks, (4, None, "lost"), (6, None, "resent")]
    done = await submit_many(
        store.db, cast(WorkQueue, again), steps, resubmitted, resend_after_s=60
    )
    assert [(d.key, d.queued) for d in done if d.queued] == [("lost", True)]
    assert done[-2].resent and _keys(again.sends) == ["lost"]
    # A read per queue call (k1-k9; k10, k11, lost and resent), and each resend look's own:
    # lost's claims it, resent's finds it sent this period and claims nothing.
    assert looks == ["clock", "clock", "clock", "claim lost", "clock"], looks


async def test_a_key_of_another_entity_queues_none_of_the_batch(store: Any) -> None:
    queue = CountingQueue(LocalQueue(store.db))
    steps = StepsTask()
    await submit_many(store.db, cast(WorkQueue, queue), steps, [(1, None, "x")], resend_after_s=300)
    batch: list[tuple[object, object, object]] = [(2, None, "a"), (3, None, "x"), (2, None, "b")]
    with pytest.raises(BadTask, match="submitted for entity 1"):
        await submit_many(store.db, cast(WorkQueue, queue), steps, batch, resend_after_s=300)
    rows = TaskStore(store.db)
    assert await rows.get("steps", "a") is None and await rows.get("steps", "b") is None
    assert _keys(queue.sends) == ["x"]  # the first call's; nothing of the refused batch
    # A key given for two entities in one list, in different queue calls: refused before
    # the first call.
    twice: list[tuple[object, object, object]] = [(2, None, f"t{n}") for n in range(12)]
    twice.append((3, None, "t0"))
    with pytest.raises(BadTask, match="given for entities 2 and 3"):
        await submit_many(store.db, cast(WorkQueue, queue), steps, twice, resend_after_s=300)
    assert await rows.get("steps", "t0") is None and _keys(queue.sends) == ["x"]


def test_the_cli_submits_a_file_of_tasks_and_refuses_a_bad_line_first(
    db_url: str, tmp_path: Path
) -> None:
    """``submit JOB --file``: a JSON Lines file in one go, keys printed in order; a bad
    line anywhere is refused with its number and nothing is queued; the same file again
    queues nothing; several ``--id`` are a task each."""
    env = migrate_task_jobs(db_url)
    lines = [{"entity_id": n % 3 + 1, "data": {"seq": n // 3}, "key": f"f{n}"} for n in range(12)]
    bad = tmp_path / "bad.jsonl"  # the bad line after the first queue call's ten
    bad.write_text("\n".join([*map(json.dumps, lines[:11]), '{"entity_id": 2, "dta": {}}']))
    refused = run_cli("submit", "steps", "--file", str(bad), env=env)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert "line 12: unknown field 'dta'" in refused.stderr, refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert json.loads(run_cli("status", "steps", "--json", env=env).stdout)["pending"] == 0
    good = tmp_path / "tasks.jsonl"
    good.write_text("\n".join(map(json.dumps, lines)) + "\n\n" + '{"entity_id": 4}\n')
    first = run_cli("submit", "steps", "--file", str(good), env=env)
    assert first.returncode == 0, first.stderr
    keys = first.stdout.split()
    assert keys[:12] == [f"f{n}" for n in range(12)] and len(keys[12]) == 32, keys
    assert "13 tasks queued, 0 submitted before" in first.stderr, first.stderr
    keyed = tmp_path / "keyed.jsonl"
    keyed.write_text("\n".join(map(json.dumps, lines)))
    again = run_cli("submit", "steps", "--file", str(keyed), "--json", env=env)
    said = [json.loads(line) for line in again.stdout.splitlines()]
    assert [(s["key"], s["queued"]) for s in said] == [(f"f{n}", False) for n in range(12)]
    several = run_cli("submit", "steps", "--id", "5", "--id", "6", "--data", '{"seq": 0}', env=env)
    assert several.returncode == 0 and len(several.stdout.split()) == 2, several.stderr
    served = run_cli("worker", "--idle-exit", "1", "--json", env=env, timeout=120)
    assert served.returncode == 0, served.stderr
    ran = effects(db_url)
    assert len(ran) == 15 and len({r[1] for r in ran}) == 15  # each task once
    order: dict[int, list[int]] = defaultdict(list)
    for entity, _key, seq, _start, _end in sorted(ran, key=lambda r: r[3]):
        order[int(entity)].append(int(seq))
    assert order[1] == order[2] == order[3] == [0, 1, 2, 3], dict(order)


def test_a_closed_client_says_so_and_builtin_jobs_are_the_clis(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'app.db'}"
    migrate_task_jobs(db_url)
    client = batchrun.connect(db=db_url, jobs=JOBS, env={})
    assert "birthday" in client.jobs  # the built-in jobs, unless BATCHRUN_BUILTIN_JOBS says
    client.close()
    with pytest.raises(RuntimeError, match=r"client is closed: batchrun\.connect"):
        client.submit("steps", 1, data={"seq": 0})
    with pytest.raises(RuntimeError, match="client is closed"):
        client.submit_many("steps", [(1, {"seq": 1})])
    client.close()  # twice is fine
    none = batchrun.connect(db=db_url, jobs=JOBS, env={"BATCHRUN_BUILTIN_JOBS": ""})
    try:
        assert "birthday" not in none.jobs and "steps" in none.jobs
    finally:
        none.close()

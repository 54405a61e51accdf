"""A consumer's routing (batchrun/pipeline/consume.py), a batch's bookkeeping
(pipeline/drain.py) and the road itself (pipeline/road.py), on fakes: what each received
message is taken for, how its disposition is counted in entities, unqueued failures queued
again, and which claimed items come back unworked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from batchrun.db.store import Claim, Scope, State
from batchrun.pipeline import drain
from batchrun.pipeline.apply import Disposition
from batchrun.pipeline.consume import UNKNOWN_JOB_DELAY_S, Consumer, give_back
from batchrun.pipeline.item import Item
from batchrun.pipeline.reports import RetrySummary, Summary
from batchrun.pipeline.road import each, travel
from batchrun.pipeline.stop import StopToken
from batchrun.policy.busy import GIVE_BACK_MAX_S
from batchrun.queue.base import QueueMessage, Received

SCOPE = Scope("birthday", "2025", "2025-06")
LEASE_S = 7.0


def received(body: str, message_id: str = "m1", receive_count: int = 1) -> Received:
    return Received(message_id, "receipt", body, receive_count)


def retry_body(job: str = "birthday", entity_id: int = 42, **extra: Any) -> str:
    return QueueMessage("retry", job, "2025-06", entity_id=entity_id, **extra).to_json()


def consumer(paused: set[str] | None = None) -> Consumer:
    steering = SimpleNamespace(
        paused=lambda job, period: "paused" if job in (paused or ()) else None
    )
    settings = SimpleNamespace(breaker_threshold=5, bug_threshold=10, lease_s=LEASE_S)
    wiring = SimpleNamespace(settings=settings, steering=steering)
    jobs = {"birthday": SimpleNamespace(period="month")}
    return Consumer(wiring, jobs, StopToken())  # type: ignore[arg-type]


# -- consume: what a message is taken for -----------------------------------------------------


def test_a_readable_message_for_a_known_job_is_worked() -> None:
    found: dict[str, Disposition] = {}
    message = consumer()._read(received(retry_body()), found)
    assert message is not None and (message.job, message.entity_id) == ("birthday", 42)
    assert found == {}


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "{}",
        '{"v": 2, "kind": "retry"}',
        '{"v": "2", "kind": "retry", "job": "birthday", "period": "2025-06", "id": 3}',
    ],
)
def test_an_unreadable_message_is_poison(body: str) -> None:
    found: dict[str, Disposition] = {}
    assert consumer()._read(received(body), found) is None
    assert found["m1"].action == "poison" and found["m1"].reason.startswith("poison: ")


def test_a_message_of_a_newer_format_is_kept_not_read_as_this_ones() -> None:
    """``"v": 99`` was worked as a v2 message; dead-lettered, a Lambda without a DLQ
    would drop it: it waits for a batchrun that reads it."""
    found: dict[str, Disposition] = {}
    body = '{"v": 99, "kind": "retry", "job": "birthday", "period": "2025-06", "id": 3}'
    assert consumer()._read(received(body), found) is None
    verdict = found["m1"]
    assert (verdict.action, verdict.keep, verdict.counted) == ("later", True, False)
    assert "v99, newer than this batchrun reads" in verdict.reason


def test_a_message_for_an_unknown_job_stays_on_the_queue_uncounted() -> None:
    found: dict[str, Disposition] = {}
    assert consumer()._read(received(retry_body(job="elsewhere")), found) is None
    verdict = found["m1"]
    assert (verdict.action, verdict.unknown_job, verdict.counted) == ("later", "elsewhere", False)
    assert verdict.delay_s == max(UNKNOWN_JOB_DELAY_S, LEASE_S)


def test_a_paused_jobs_message_waits_a_lease_kept_whatever_its_kind() -> None:
    """Kept: an SQS redrive policy dead-lettered a paused job's shards and retries after
    a few leases of pause (each receive counted)."""
    shard = QueueMessage("shard", "birthday", "2025-06", after_id=0, until_id=1000)
    for body in (retry_body(), shard.to_json()):
        found: dict[str, Disposition] = {}
        assert consumer(paused={"birthday"})._read(received(body), found) is None
        # No work for this worker: it holds no --idle-exit (awaited=False).
        assert found["m1"] == Disposition(
            "later", "paused", delay_s=LEASE_S, counted=False, keep=True, awaited=False
        )


def test_a_message_whose_entity_was_not_worked_here() -> None:
    c = consumer()
    done = Claim(1, int(State.SUCCEEDED), None, None)
    assert c._unworked(done, lost=False) == Disposition("delete", counted=False)
    held = Claim(1, int(State.PENDING), "another run", 10)
    for claim, lost in ((held, False), (None, False), (done, True)):
        assert c._unworked(claim, lost=lost) == Disposition("later", delay_s=LEASE_S, counted=False)


def test_a_busy_message_is_given_back_with_its_count_one_up() -> None:
    verdict = Disposition("later", "busy", delay_s=0.0, busy=True, keep=True, counted=False)
    message = QueueMessage("retry", "birthday", "2025-06", entity_id=5, busy=2)
    back = give_back(verdict, received(message.to_json(), receive_count=1), message)
    assert json.loads(back.body or "")["busy"] == 3
    assert 0 < back.delay_s <= GIVE_BACK_MAX_S and back.busy and back.keep
    asked = give_back(replace(verdict, delay_s=45.0), received("{}", receive_count=1), message)
    assert asked.delay_s >= 45.0, "at least what the backend asked for"


# -- drain: counted in entities --------------------------------------------------------------


def test_each_disposition_is_counted_once_in_entities() -> None:
    result = RetrySummary()
    run = Summary("birthday", "2025-06", dry_run=False)
    run.succeeded, run.skipped, run.failed = 3, 1, 1
    for verdict in [
        Disposition("delete", outcome=State.SUCCEEDED),
        Disposition("delete", outcome=State.SKIPPED),
        Disposition("dead", "550", outcome=State.FAILED),
        Disposition("later", "451", outcome=State.RETRYING, unknown=True),
        Disposition("delete", outcome=State.SUCCEEDED, counted=False),  # a second message
        Disposition("poison", "poison: not json"),
        Disposition("later", unknown_job="elsewhere", counted=False),
        Disposition("delete", not_eligible=True, counted=False),
        Disposition("later", busy=True, counted=False),
        Disposition("delete", summary=run),  # a continuation's run
    ]:
        drain.count(result, verdict)
    # failed: the dead one, the one retrying later (a temporary failure) and the run's one
    assert (result.succeeded, result.skipped, result.failed) == (4, 2, 3)
    assert result.processed == 4 + 1 + 5, "four entities, the poison message, the run's five"
    assert (result.poison, result.dead_lettered) == (1, 2), "the failed entity and the poison"
    assert (result.unknown_job, result.unknown_jobs) == (1, {"elsewhere"})
    assert (result.not_eligible, result.busy, result.unknown_outcome) == (1, 1, 1)


class RequeueStore:
    def __init__(self, rows: list[tuple[Scope, int, int, str | None]]) -> None:
        self.rows = rows
        self.marked: list[tuple[Scope, list[int]]] = []

    async def unqueued_failures(self, limit: int) -> list[tuple[Scope, int, int, str | None]]:
        rows, self.rows = self.rows[:limit], self.rows[limit:]
        return rows

    async def mark_queued(self, scope: Scope, ids: list[int]) -> None:
        self.marked.append((scope, ids))


class SentQueue:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, bodies: list[str], delay_s: float = 0.0) -> None:
        self.sent.extend(json.loads(b) for b in bodies)


async def test_failures_a_run_could_not_queue_are_queued_and_marked() -> None:
    other = Scope("renewal", "2025", "2025-06")
    store = RequeueStore([(SCOPE, 1, 2, "451"), (other, 9, 1, None), (SCOPE, 3, 1, None)])
    queue = SentQueue()
    jobs = {"birthday": object()}
    assert await drain.requeue_unqueued(store, queue, jobs) == 2  # type: ignore[arg-type]
    assert [(m["job"], m["id"], m["attempt"]) for m in queue.sent] == [
        ("birthday", 1, 2),
        ("birthday", 3, 1),
    ], "only the jobs this process knows"
    assert store.marked == [(SCOPE, [1, 3])]


async def test_a_batch_is_worked_settled_and_counted() -> None:
    class FakeConsumer:
        async def process(self, items: Sequence[Received], options: Any) -> Any:
            return (
                {
                    "a": Disposition("delete", outcome=State.SUCCEEDED),
                    "b": Disposition("later", "451", outcome=State.RETRYING),
                },
                True,
                1,
            )

        def take_resent(self) -> int:
            return 2  # lost tasks its look-out sent again while it worked the batch

    class BatchQueue:
        def __init__(self) -> None:
            self.calls: list[str] = []

        async def delete(self, items: list[Received]) -> None:
            self.calls += [f"delete {i.message_id}" for i in items]

        async def keep(self, item: Received, delay_s: float) -> None:
            self.calls.append(f"later {item.message_id}")

    queue = BatchQueue()
    result = RetrySummary()
    items = [received("{}", "a"), received("{}", "b")]
    broken = await drain.work_batch(
        FakeConsumer(),
        queue,
        items,
        None,
        result,
        visibility_s=30,  # type: ignore[arg-type]
    )
    assert broken is True
    assert (result.succeeded, result.processed, result.lost_claims) == (1, 2, 1)
    assert result.requeued == 2
    assert queue.calls == ["later b", "delete a"]


# -- road: what comes back unworked ----------------------------------------------------------


class FakeWorker:
    def __init__(self, stop: StopToken, *, stop_at: int, lost: set[int]) -> None:
        self.stop = stop
        self.stop_at = stop_at
        self.worked: list[int] = []
        self.unstarted = [Item(SCOPE, 100), Item(SCOPE, 101)]  # e.g. dropped by the breaker
        self.lease = SimpleNamespace(lost=lambda item: item.id in lost)

    async def work(self, item: Item) -> None:
        self.worked.append(item.id)
        if item.id == self.stop_at:
            self.stop.request("test")
        await asyncio.sleep(0)


async def test_the_road_works_each_item_and_hands_back_the_unworked_but_lost() -> None:
    stop = StopToken()
    worker = FakeWorker(stop, stop_at=2, lost={101, 200})
    items = [Item(SCOPE, i) for i in range(1, 6)]

    async def source() -> AsyncIterator[Item]:
        for item in items:
            yield item

    leftover = await travel(
        source(),
        worker,  # type: ignore[arg-type]
        concurrency=1,
        stop=stop,
        grace_s=1.0,
        unyielded=[Item(SCOPE, 200), Item(SCOPE, 201)],
    )
    ids = [i.id for i in leftover]
    assert worker.worked[:2] == [1, 2]
    assert not set(worker.worked) & set(ids), "a worked item never comes back"
    assert {201, 100} <= set(ids), "the source's unyielded and the worker's unstarted come back"
    assert 200 not in ids and 101 not in ids, "an item another process took over does not"


async def test_each_yields_items_already_claimed_in_order() -> None:
    items = [Item(SCOPE, 3), Item(SCOPE, 1)]
    assert [i async for i in each(items)] == items

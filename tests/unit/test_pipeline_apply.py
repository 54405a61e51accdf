"""The end of the road (batchrun/pipeline/apply.py) on fakes: each outcome's next action
(Disposition), the group commit (Applier), the ledger writes and queue messages of a
page's entities (LedgerWrites), and how received messages are settled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from batchrun.db.store import Scope, State
from batchrun.errors import QueueError
from batchrun.pipeline.apply import (
    Applier,
    Disposition,
    LedgerWrites,
    disposition,
    settle_messages,
)
from batchrun.pipeline.item import Item
from batchrun.pipeline.outcomes import Outcome
from batchrun.pipeline.reports import Summary
from batchrun.queue.base import Received

SCOPE = Scope("birthday", "2025", "2025-06")


def received(message_id: str, body: str = "{}") -> Received:
    return Received(message_id, f"receipt-{message_id}", body, 1)


# -- disposition ------------------------------------------------------------------------------


def test_the_next_action_of_each_outcome() -> None:
    assert disposition(Outcome(State.SUCCEEDED)) == Disposition("delete", outcome=State.SUCCEEDED)
    assert disposition(Outcome(State.SKIPPED)) == Disposition("delete", outcome=State.SKIPPED)
    assert disposition(Outcome(State.FAILED, "550 no such user")) == Disposition(
        "dead", "550 no such user", outcome=State.FAILED
    )
    assert disposition(Outcome(State.FAILED)).reason == "failed"
    later = disposition(Outcome(State.RETRYING, "451 later", delay_s=30, unknown=True))
    assert later == Disposition(
        "later", "451 later", delay_s=30, outcome=State.RETRYING, unknown=True
    )
    busy = disposition(Outcome(State.RETRYING, busy=True, delay_s=5))
    assert (busy.action, busy.busy, busy.keep, busy.counted) == ("later", True, True, False)
    assert (busy.reason, busy.delay_s, busy.outcome) == ("busy", 5, None)


# -- Applier ----------------------------------------------------------------------------------


async def test_record_returns_once_written_and_notes_a_messages_action() -> None:
    written: list[list[tuple[int, State]]] = []
    gate = asyncio.Event()

    async def write(batch: Sequence[tuple[Item, Outcome]]) -> None:
        await gate.wait()
        written.append([(i.id, o.state) for i, o in batch])

    applier = Applier(write)
    page_item = Item(SCOPE, 1)
    asked = Item(SCOPE, 2, message=received("m2"))
    first = asyncio.create_task(applier.record(page_item, Outcome(State.SUCCEEDED)))
    second = asyncio.create_task(applier.record(asked, Outcome(State.FAILED, "bounced")))
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done(), "not durable yet: the write waits"
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert written == [[(1, State.SUCCEEDED), (2, State.FAILED)]], "one group commit"
    assert applier.dispositions == {"m2": Disposition("dead", "bounced", outcome=State.FAILED)}
    await applier.close()


async def test_a_failed_write_fails_every_record_of_its_batch() -> None:
    async def write(batch: Sequence[tuple[Item, Outcome]]) -> None:
        raise ConnectionError("database gone")

    applier = Applier(write)
    results = await asyncio.gather(
        applier.record(Item(SCOPE, 1, message=received("m1")), Outcome(State.SUCCEEDED)),
        applier.record(Item(SCOPE, 2), Outcome(State.SUCCEEDED)),
        return_exceptions=True,
    )
    assert all(isinstance(r, ConnectionError) for r in results)
    assert applier.dispositions == {}, "no action for a message whose outcome was not written"
    await applier.close()


# -- LedgerWrites -----------------------------------------------------------------------------


class FakeStore:
    def __init__(self, changed: dict[int, bool] | None = None) -> None:
        self.finished: list[dict[str, Any]] = []
        self.changed = changed or {}  # id -> False: another run took the row

    async def finish(
        self,
        scope: Scope,
        *,
        ids: Sequence[int],
        me: str,
        state: State,
        error: str | None,
        queued: bool,
    ) -> int:
        self.finished.append({"ids": list(ids), "state": state, "error": error, "queued": queued})
        return sum(1 for i in ids if self.changed.get(i, True))


class FakeLease:
    me = "me"

    def __init__(self) -> None:
        self.released: list[list[int]] = []
        self.let_go_ids: list[int] = []
        self.lost: list[tuple[list[int], int]] = []

    async def release(self, scope: Scope, ids: Sequence[int]) -> None:
        self.released.append(list(ids))

    def let_go(self, scope: Scope, ids: Sequence[int]) -> None:
        self.let_go_ids.extend(ids)

    def note_lost(self, scope: Scope, ids: Sequence[int], changed: int, what: str) -> int:
        self.lost.append((list(ids), changed))
        return len(ids) - changed


class FakeQueue:
    def __init__(self, *, down: bool = False) -> None:
        self.down = down
        self.sent: list[tuple[list[dict[str, Any]], float]] = []
        self.dead: list[tuple[dict[str, Any], str]] = []

    async def send(self, bodies: list[str], delay_s: float = 0.0) -> None:
        if self.down:
            raise QueueError("queue unreachable")
        self.sent.append(([json.loads(b) for b in bodies], delay_s))

    async def send_dead(self, pairs: list[tuple[str, str]]) -> None:
        if self.down:
            raise QueueError("queue unreachable")
        self.dead.extend((json.loads(b), reason) for b, reason in pairs)


def writes(
    queue: FakeQueue | None, *, enqueue: bool = True, changed: dict[int, bool] | None = None
) -> tuple[LedgerWrites, FakeStore, FakeLease, Summary]:
    store, lease = FakeStore(changed), FakeLease()
    summary = Summary("birthday", "2025-06", dry_run=False)
    lw = LedgerWrites(store, queue, lease, summary=summary, enqueue=enqueue)  # type: ignore[arg-type]
    return lw, store, lease, summary


async def test_successes_are_one_write_and_failures_one_per_reason() -> None:
    lw, store, lease, summary = writes(FakeQueue())
    await lw.write(
        [
            (Item(SCOPE, 1), Outcome(State.SUCCEEDED, "ignored for a success")),
            (Item(SCOPE, 2), Outcome(State.SUCCEEDED)),
            (Item(SCOPE, 3), Outcome(State.SKIPPED, "invalid address")),
            (Item(SCOPE, 4), Outcome(State.SKIPPED, "invalid address")),
        ]
    )
    assert store.finished == [
        {"ids": [1, 2], "state": State.SUCCEEDED, "error": None, "queued": False},
        {"ids": [3, 4], "state": State.SKIPPED, "error": "invalid address", "queued": False},
    ]
    assert sorted(lease.let_go_ids) == [1, 2, 3, 4], "finished claims are let go"
    assert (summary.queued_for_retry, summary.dead_lettered, summary.lost_claims) == (0, 0, 0)


async def test_a_pages_failures_get_one_message_each() -> None:
    queue = FakeQueue()
    lw, store, _, summary = writes(queue)
    await lw.write(
        [
            (Item(SCOPE, 1, attempts=2), Outcome(State.RETRYING, "451 later")),
            (Item(SCOPE, 2), Outcome(State.RETRYING, "451 later", delay_s=60)),
            (Item(SCOPE, 3), Outcome(State.FAILED, "550 unknown")),
        ]
    )
    (now, _), (delayed, delay) = queue.sent
    assert [(b["kind"], b["id"], b["attempt"]) for b in now] == [("retry", 1, 3)]
    assert [b["id"] for b in delayed] == [2] and delay == 60
    assert [(b["id"], reason) for b, reason in queue.dead] == [(3, "550 unknown")]
    assert [(f["ids"], f["queued"]) for f in store.finished] == [
        ([1], True),
        ([2], True),
        ([3], False),  # a dead letter waits for nothing
    ]
    assert (summary.queued_for_retry, summary.dead_lettered) == (2, 1)


async def test_a_retry_already_waiting_on_the_queue_is_not_queued_again() -> None:
    queue = FakeQueue()
    lw, store, _, summary = writes(queue)
    await lw.write([(Item(SCOPE, 1, queued=True), Outcome(State.RETRYING, "451"))])
    assert queue.sent == []
    assert store.finished[0]["queued"] is True and summary.queued_for_retry == 1


async def test_failures_stay_in_the_ledger_when_the_queue_is_down() -> None:
    lw, store, _, summary = writes(FakeQueue(down=True))
    await lw.write([(Item(SCOPE, 1), Outcome(State.RETRYING, "451"))])
    assert store.finished[0]["queued"] is False, "marked unqueued: queued again later"
    assert (summary.not_queued, summary.queued_for_retry) == (1, 0)


async def test_a_consumers_entities_are_written_without_new_messages() -> None:
    queue = FakeQueue()
    lw, store, _, _ = writes(queue, enqueue=False)
    await lw.write([(Item(SCOPE, 1), Outcome(State.RETRYING, "451"))])
    assert queue.sent == [] and store.finished[0]["queued"] is True, "its message is reused"


async def test_busy_entities_are_released_with_no_attempt_written() -> None:
    lw, store, lease, _ = writes(FakeQueue())
    await lw.write([(Item(SCOPE, 7), Outcome(State.RETRYING, "busy", busy=True))])
    assert lease.released == [[7]] and store.finished == []


async def test_rows_another_run_took_are_counted_lost_and_not_this_runs() -> None:
    lw, _, lease, summary = writes(FakeQueue(), changed={2: False})
    summary.succeeded = 3  # what the workers counted
    await lw.write([(Item(SCOPE, i), Outcome(State.SUCCEEDED)) for i in (1, 2, 3)])
    assert lease.lost == [([1, 2, 3], 2)]
    assert (summary.lost_claims, summary.succeeded) == (1, 2)


# -- settle_messages --------------------------------------------------------------------------


class SettleQueue:
    def __init__(self, *, give_back_ok: bool = True) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.give_back_ok = give_back_ok

    async def delete(self, items: list[Received]) -> None:
        self.calls.append(("delete", [i.message_id for i in items]))

    async def dead_letter(self, item: Received, reason: str) -> None:
        self.calls.append(("dead_letter", (item.message_id, reason)))

    async def send_dead(self, pairs: list[tuple[str, str]]) -> None:
        self.calls.append(("send_dead", pairs))

    async def retry_later(self, item: Received, delay_s: float) -> None:
        self.calls.append(("retry_later", (item.message_id, delay_s)))

    async def keep(self, item: Received, delay_s: float) -> None:
        self.calls.append(("keep", (item.message_id, delay_s)))

    async def give_back(self, item: Received, body: str, delay_s: float) -> bool:
        self.calls.append(("give_back", (item.message_id, body, delay_s)))
        return self.give_back_ok


DISPOSITIONS = {
    "done": Disposition("delete", outcome=State.SUCCEEDED),
    "dead": Disposition("dead", "550", outcome=State.FAILED),
    "poison": Disposition("poison", "not json"),
    "later": Disposition("later", "451", delay_s=30, outcome=State.RETRYING),
    "waiting": Disposition("later", keep=True, counted=False, delay_s=2),
    "busy": Disposition("later", "busy", delay_s=4, busy=True, keep=True, body='{"busy":1}'),
}


async def test_the_cli_settles_each_message_by_its_disposition() -> None:
    queue = SettleQueue()
    items = [received(m) for m in [*DISPOSITIONS, "unworked"]]
    failed = await settle_messages(queue, items, DISPOSITIONS)  # type: ignore[arg-type]
    assert failed == []
    assert queue.calls == [
        ("dead_letter", ("dead", "550")),
        ("dead_letter", ("poison", "not json")),
        # Kept (a fresh copy near the redrive limit): the retry policy decides when an
        # entity is dead, never a count of receives that were no attempt.
        ("keep", ("later", 30)),
        ("keep", ("waiting", 2)),
        ("give_back", ("busy", '{"busy":1}', 4)),
        ("keep", ("unworked", 0.0)),  # its batch stopped first: it comes back
        ("delete", ["done", "busy"]),  # a busy one given back as a fresh copy goes
    ]


async def test_the_lambdas_event_source_gets_the_failures_back_instead() -> None:
    queue = SettleQueue()
    items = [received(m, body=f'{{"m":"{m}"}}') for m in [*DISPOSITIONS, "unworked"]]
    failed = await settle_messages(queue, items, DISPOSITIONS, event_source=True)  # type: ignore[arg-type]
    assert [f.message_id for f in failed] == ["later", "waiting", "unworked"]
    assert queue.calls == [
        ("send_dead", [('{"m":"dead"}', "550")]),  # straight to the DLQ: no failure
        ("send_dead", [('{"m":"poison"}', "not json")]),  # poison too: never delivered again
        ("keep", ("later", 30)),
        ("keep", ("waiting", 2)),
        ("give_back", ("busy", '{"busy":1}', 4)),
    ], "nothing deleted here: SQS deletes what is not a failure"


@pytest.mark.parametrize("event_source", [False, True])
async def test_a_busy_message_not_given_back_waits_for_its_visibility(event_source: bool) -> None:
    queue = SettleQueue(give_back_ok=False)
    failed = await settle_messages(
        queue,  # type: ignore[arg-type]
        [received("busy")],
        {"busy": DISPOSITIONS["busy"]},
        event_source=event_source,
    )
    assert [f.message_id for f in failed] == (["busy"] if event_source else [])
    assert ("delete", ["busy"]) not in queue.calls


def test_a_runs_failure_reasons_stay_bounded() -> None:
    """One reason per failed entity (a refusal naming each recipient) kept one key each,
    growing with the period; past a hundred they count together."""
    from batchrun.pipeline.reports import MAX_REASONS, OTHER_REASONS, Summary

    summary = Summary(job="birthday", period="2025-06", dry_run=False)
    for n in range(5000):
        summary.failed_for(f"550 5.1.1 <user{n}@example.com>: no such user")
    summary.failed_for("550 5.1.1 <user0@example.com>: no such user", 2)
    assert summary.failed == 5002 and len(summary.failure_reasons) == MAX_REASONS + 1
    assert summary.common_failures(2) == [
        (OTHER_REASONS, 5000 - MAX_REASONS),
        ("550 5.1.1 <user0@example.com>: no such user", 3),
    ]
    assert "failure_reasons" not in summary.to_json()

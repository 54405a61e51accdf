"""Queue consumers: retries, submitted tasks, continuations and shards, with their verdicts.

The same processing serves ``batchrun retry`` (drain once), ``batchrun worker`` (until
SIGTERM) and the SQS-triggered Lambda (its batchItemFailures). Each retry or task message
names one entity: it is re-checked through the job's page, then claimed like any other and
worked by the same ``Worker``. An entity the page does not return (deleted, deactivated, or
a task for the wrong period) is dropped, counted ``not_eligible``, with the ledger left as
it was: it stays eligible for its own period. A message for a job this process does not
know stays on the queue (``unknown_job``) for a process that knows it. Tasks submitted
to a ``batchrun.Task`` job are served by ``batchrun.tasks.serve``. Counted in entities,
not messages: a second message for an entity in the same batch, or one for an entity
already finished, is deleted without work.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from batchrun.db.store import FINAL_STATES, Claim, Scope, State
from batchrun.effects.sending import BREAKER_REASON
from batchrun.errors import LockTimeoutError
from batchrun.job import Context, Job
from batchrun.period import Period
from batchrun.period import parse as parse_period
from batchrun.pipeline.engine import Runner
from batchrun.pipeline.lease import Lease
from batchrun.pipeline.outcomes import Outcome
from batchrun.pipeline.pager import prepare, recheck
from batchrun.pipeline.recorder import Item, Recorder
from batchrun.pipeline.reports import Summary
from batchrun.pipeline.run import Options, run_period
from batchrun.pipeline.work import Worker
from batchrun.policy.rate import AdaptiveRate
from batchrun.queue.base import PoisonMessage, QueueMessage, Received, UnknownJob, backoff_s

if TYPE_CHECKING:
    from batchrun.runtime.runtime import Runtime

log = logging.getLogger(__name__)
NOT_ELIGIBLE = "not eligible any more"
UNKNOWN_JOB_DELAY_S = 60.0  # a message for an unknown job waits this long for another process


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one received queue message after working on it."""

    action: Literal["delete", "later", "dead", "poison"]
    reason: str = ""
    delay_s: float = 0.0
    outcome: State | None = None  # the entity's outcome, when the message named one
    summary: Summary | None = None  # the run a continuation or shard message started
    counted: bool = True  # False for a second message naming an entity already counted
    not_eligible: bool = False  # the page does not return its entity: dropped, ledger as was
    unknown_job: str | None = None  # a job this process does not know: kept on the queue
    unknown: bool = False  # the job's statement lost its reply (unknown_outcome)
    keep: bool = False  # kept on the queue, no receive counted (a task waiting its turn)


async def process(
    rt: Runtime, items: Sequence[Received], options: Options
) -> tuple[dict[str, Verdict], bool, int]:
    """Work on received messages; say what to do with each (by message id), whether the
    mail backend was found unreachable (the breaker opened), and how many claims on the
    entities retry and task messages name were taken over by another run meanwhile (a
    continuation's or shard's own are in its summary)."""
    verdicts: dict[str, Verdict] = {}
    groups: dict[tuple[str, str], list[tuple[Received, QueueMessage]]] = {}
    broken = False
    lost_claims = 0
    units = {name: job.period for name, job in rt.jobs.items()}
    tasks: list[tuple[Received, QueueMessage]] = []  # submitted to batchrun.Task jobs
    for item in items:
        try:
            message = QueueMessage.from_json(item.body, units)
        except UnknownJob as exc:
            # Not poison: a process started with that job's --jobs does it.
            log.info("message %s is for %s: left on the queue", item.message_id, exc)
            delay = max(UNKNOWN_JOB_DELAY_S, rt.settings.lease_s)
            verdicts[item.message_id] = Verdict(
                "later", str(exc), delay_s=delay, counted=False, unknown_job=exc.job
            )
            continue
        except PoisonMessage as exc:
            log.error("poison message %s: %s", item.message_id, exc)
            verdicts[item.message_id] = Verdict("poison", f"poison: {exc}")
            continue
        if message.kind == "entity_task":
            if rt.steering.paused(message.job, None) is not None:  # `batchrun pause JOB`
                verdicts[item.message_id] = Verdict(
                    "later", "paused", delay_s=rt.settings.lease_s, counted=False, keep=True
                )
            else:
                tasks.append((item, message))
            continue
        job = rt.jobs[message.job]
        period = parse_period(job.period, message.period)
        if rt.steering.paused(message.job, message.period) is not None:
            # `batchrun pause`: no new work on the job; the message waits on the queue.
            verdicts[item.message_id] = Verdict(
                "later", "paused", delay_s=rt.settings.lease_s, counted=False
            )
            continue
        if message.kind in ("continuation", "shard"):
            log.info(
                "%s of %s %s: ids (%d, %d]",
                message.kind,
                message.job,
                message.period,
                message.after_id,
                message.until_id,
            )
            run_options = replace(options, breaker_handoff=False)
            if message.limit is not None:
                run_options = replace(run_options, limit=message.limit)
            summary = await run_period(
                rt, job, period, run_options, after=message.after_id, until=message.until_id
            )
            broken = broken or summary.stopped == BREAKER_REASON
            pinned = message.limit is not None and summary.eligible >= message.limit
            if summary.stopped == BREAKER_REASON and not pinned:
                # What it claimed is queued for retry; the rest of the range waits in this
                # same message for a later delivery. (A limited one claimed its whole share
                # and queued it: delivered again, it would take a second share.)
                delay = max(
                    rt.settings.lease_s,
                    backoff_s(
                        item.receive_count,
                        base_s=rt.settings.retry_base_s,
                        max_s=rt.settings.retry_max_backoff_s,
                    ),
                )
                verdicts[item.message_id] = Verdict(
                    "later", BREAKER_REASON, delay_s=delay, summary=summary
                )
            else:
                verdicts[item.message_id] = Verdict("delete", summary=summary)
            continue
        groups.setdefault((message.job, message.period), []).append((item, message))
    for (name, text), entries in groups.items():
        job = rt.jobs[name]
        found, opened, lost = await _entities(
            rt, job, parse_period(job.period, text), entries, options
        )
        verdicts.update(found)
        broken = broken or opened
        lost_claims += lost
    if tasks:
        from batchrun.tasks.serve import serve

        verdicts.update(await serve(rt, tasks, options))
    return verdicts, broken, lost_claims


async def _entities(
    rt: Runtime,
    job: Job,
    period: Period,
    entries: list[tuple[Received, QueueMessage]],
    options: Options,
) -> tuple[dict[str, Verdict], bool, int]:
    """Redo the entities the messages name; one verdict per message, whether the breaker
    opened, and the claims lost."""
    stop = rt.stop.child()
    try:
        async with Lease(
            rt.store, lease_s=rt.settings.lease_s, stop=stop, steering=rt.steering
        ) as lease:
            limiter = await rt.retry_limiter(options)
            ctx, _ = rt.context(
                job, period, lease=lease, stop=stop, limiter=limiter, breaker=rt.breaker
            )
            scope = Scope(job.name, str(ctx.once), str(period))
            outcomes, claims, lost, gone = await _work(
                rt, job, ctx, scope, lease, limiter, entries, options
            )
            opened = rt.breaker.open
            lost_claims = lease.lost_claims
    finally:
        stop.detach()
    verdicts: dict[str, Verdict] = {}
    seen: set[int] = set()
    for received, message in entries:
        uid = message.entity_id
        if uid in seen:
            verdicts[received.message_id] = Verdict("delete", counted=False)  # a duplicate
            continue
        seen.add(uid)
        if uid in gone:
            log.info("%s %s: entity %d is not eligible: dropped", job.name, period, uid)
            verdicts[received.message_id] = Verdict("delete", NOT_ELIGIBLE, not_eligible=True)
            continue
        verdicts[received.message_id] = _verdict(
            rt, outcomes.get(uid), claims.get(uid), lost=uid in lost
        )
    return verdicts, opened, lost_claims


async def _work(
    rt: Runtime,
    job: Job,
    ctx: Context,
    scope: Scope,
    lease: Lease,
    limiter: AdaptiveRate | None,
    entries: list[tuple[Received, QueueMessage]],
    options: Options,
) -> tuple[dict[int, Outcome], dict[int, Claim], set[int], set[int]]:
    """Outcomes of the entities worked, the ledger rows, the claims lost, and the entities
    the page does not return."""
    assert rt.queue is not None
    ids = sorted({m.entity_id for _, m in entries})
    before = await rt.store.claims_of(scope, ids)
    todo = [uid for uid in ids if (c := before.get(uid)) is None or c.state not in FINAL_STATES]
    claims = dict(before)
    if not todo:
        return {}, claims, set(), set()
    # Re-checked before any claim: an entity the page does not return leaves no trace in
    # the ledger, so a task for the wrong period cannot finish it for its own.
    rows: dict[int, dict[str, Any]] = {}
    for uid in todo:
        row = await recheck(job, ctx, uid)
        if row is not None:
            rows[uid] = row
    gone = {uid for uid in todo if uid not in rows}
    todo = [uid for uid in todo if uid in rows]
    if not todo:
        return {}, claims, set(), gone
    try:
        claims.update(await lease.claim(scope, todo, [u for u in todo if u not in before]))
    except LockTimeoutError as exc:
        # Another session holds these ledger rows: their messages come back later.
        log.warning("%s %s: ledger rows locked, retried later: %s", job.name, scope.period, exc)
        return {}, claims, set(), gone
    mine = [u for u in todo if claims[u].owner == lease.me and claims[u].state not in FINAL_STATES]
    outcomes: dict[int, Outcome] = {}
    recorder = Recorder(rt.store, rt.queue, lease, summary=None, enqueue=False)
    items = [Item(scope, uid, rows[uid], claims[uid].attempts, claims[uid].queued) for uid in mine]
    try:
        if items:
            await prepare(job, ctx, [i.row for i in items])
        worker = _worker(rt, job, ctx, lease, recorder, limiter, outcomes)
        runner: Runner[Item] = Runner(
            concurrency=options.concurrency,
            stop=lease.stop,
            grace_s=options.grace_s,
            on_progress=options.on_progress,
        )
        result = await runner.run(_iterate(items), worker.work)
    finally:
        await recorder.close()
    leftover = [i.id for i in [*result.not_started, *result.cancelled, *worker.unstarted]]
    lease.let_go(scope, leftover)  # first, as the recorder does (a heartbeat in between)
    await rt.store.release(scope, ids=leftover, me=lease.me)
    return outcomes, claims, {i.id for i in worker.lost}, gone


def _worker(
    rt: Runtime,
    job: Job,
    ctx: Context,
    lease: Lease,
    recorder: Recorder,
    limiter: AdaptiveRate | None,
    outcomes: dict[int, Outcome],
) -> Worker:
    assert rt.queue is not None

    def note(item: Item, outcome: Outcome) -> None:
        outcomes[item.id] = outcome

    return Worker(
        job,
        ctx,
        lease=lease,
        recorder=recorder,
        breaker=rt.breaker,
        stop=lease.stop,
        limiter=limiter,
        policy=rt.policy(job),
        at_once=False,  # a retry's failure backs off (or waits the delay it asked for)
        on_outcome=note,
        bugs=rt.bugs,
    )


def _verdict(rt: Runtime, outcome: Outcome | None, claim: Claim | None, *, lost: bool) -> Verdict:
    if outcome is None:
        if claim is not None and claim.state in FINAL_STATES and not lost:
            return Verdict("delete", counted=False)  # finished meanwhile: nothing to do
        # Another live run holds the entity, or we stopped first: look again later.
        return Verdict("later", delay_s=rt.settings.lease_s, counted=False)
    if outcome.state in (State.SENT, State.SKIPPED):
        return Verdict("delete", outcome=outcome.state)
    if outcome.state is State.FAILED:
        return Verdict("dead", outcome.reason or "failed", outcome=State.FAILED)
    attempts = (claim.attempts if claim else 0) + 1
    delay = outcome.delay_s
    if delay is None:
        delay = backoff_s(
            attempts, base_s=rt.settings.retry_base_s, max_s=rt.settings.retry_max_backoff_s
        )
    return Verdict(
        "later",
        outcome.reason or "",
        delay_s=delay,
        outcome=State.RETRYING,
        unknown=outcome.unknown,
    )


async def _iterate(items: Sequence[Item]) -> AsyncIterator[Item]:
    for item in items:
        yield item

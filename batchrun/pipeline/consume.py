"""Queue consumers: retries, submitted tasks, continuations and shards, each on the road.

The same ``Consumer`` serves ``batchrun retry`` (drain once), ``batchrun worker`` (until
SIGTERM) and the SQS-triggered Lambda (its batchItemFailures); each caller settles the
dispositions with ``apply.settle_messages``. What a message asks for:

- a retry names one entity: it is re-checked through the job's page, claimed like any
  other and worked by the same ``EntityWorker``; an entity the page does not return (deleted,
  deactivated, or a task for the wrong period) is dropped, counted ``not_eligible``, the
  ledger left as it was (it stays eligible for its own period);
- a submitted task (``batchrun.Task``) goes through ``pipeline.tasks``: one entity's at a
  time, in submission order;
- a continuation or a shard is a range of a period: a run of its own (``run_period``);
- a message for a job this process does not know stays on the queue (``unknown_job``)
  for a process that knows it; one that cannot be read is poison.

Counted in entities, not messages: a second message for an entity in the same batch, or
one for an entity already finished, is deleted without work.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from batchrun.control.steering import Working
from batchrun.db.store import FINAL_STATES, Claim, Scope
from batchrun.errors import LockTimeoutError
from batchrun.job import Job
from batchrun.period import Period
from batchrun.period import parse as parse_period
from batchrun.pipeline.apply import PAUSED, Applier, Disposition, LedgerWrites
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.item import Item
from batchrun.pipeline.lease import Lease
from batchrun.pipeline.pager import prepare, recheck
from batchrun.pipeline.road import each, travel
from batchrun.pipeline.run import Options, run_period
from batchrun.pipeline.wiring import Wiring
from batchrun.pipeline.work import EntityWorker
from batchrun.policy.bugs import BugStreak
from batchrun.policy.busy import busy_delay_s
from batchrun.policy.pacing import CircuitBreaker, stopped_by_breaker
from batchrun.policy.rate import AdaptiveRate
from batchrun.queue.base import (
    PoisonMessage,
    QueueMessage,
    Received,
    UnknownFormat,
    UnknownJob,
    backoff_s,
)
from batchrun.tasks.resend import LostTaskSweep
from batchrun.tasks.store import TaskStore

log = logging.getLogger(__name__)
NOT_ELIGIBLE = "not eligible any more"
UNKNOWN_JOB_DELAY_S = 60.0  # a message for an unknown job waits this long for another process

Entry = tuple[Received, QueueMessage]


class Consumer:
    """Works received messages for the jobs it knows, with one pacer, one circuit breaker
    and one bug streak for its whole life (a drain, a worker process, an invocation), so
    connection failures and a job's bug show across batches."""

    def __init__(self, w: Wiring, jobs: Mapping[str, Job], stop: StopToken) -> None:
        self.w = w
        self.jobs = jobs
        self.stop = stop
        self.breaker = CircuitBreaker(w.settings.breaker_threshold)
        self.bugs = BugStreak(w.settings.bug_threshold)
        self._limiter: AdaptiveRate | None = None
        self._limiter_made = False
        self._lost_tasks: LostTaskSweep | None = None  # made with the first task message
        # The jobs (and periods) whose messages it works: a cancel of one stops a drain's
        # or a worker's loop (``queue_loops``).
        self.working = Working(linger_s=w.settings.lease_s)

    async def limiter(self, options: Options) -> AdaptiveRate | None:
        """One pacer for the consumer's life (``--rate``)."""
        if not self._limiter_made:
            self._limiter = await self.w.effects.limiter(options.rate)
            self._limiter_made = True
        return self._limiter

    def lost_tasks(self) -> LostTaskSweep | None:
        """One look-out for lost tasks for the consumer's life (``tasks/resend.py``)."""
        if self._lost_tasks is None and self.w.queue is not None:
            store, after_s = TaskStore(self.w.store.db), self.w.settings.task_resend_s
            self._lost_tasks = LostTaskSweep(store, self.w.queue, after_s=after_s)
        return self._lost_tasks

    def take_resent(self) -> int:
        """Lost tasks its look-out sent again since the last call (a drain's ``requeued``)."""
        if self._lost_tasks is None:
            return 0
        sent, self._lost_tasks.sent = self._lost_tasks.sent, 0
        return sent

    async def process(
        self, items: Sequence[Received], options: Options
    ) -> tuple[dict[str, Disposition], bool, int]:
        """Work on received messages; say what to do with each (by message id), whether the
        mail backend was found unreachable (the breaker opened), and how many claims on the
        entities retry messages name were taken over by another run meanwhile (a
        continuation's or shard's own are in its summary)."""
        try:
            async with self.w.effects.backends.session(options.rate):
                found, broken, lost_claims, parsed = await self._process(items, options)
        finally:
            self.working.batch_ended()
        for message_id, verdict in found.items():
            if verdict.busy:
                found[message_id] = give_back(verdict, *parsed[message_id])
        return found, broken, lost_claims

    async def _process(
        self, items: Sequence[Received], options: Options
    ) -> tuple[dict[str, Disposition], bool, int, dict[str, Entry]]:
        found: dict[str, Disposition] = {}
        groups: dict[tuple[str, str], list[Entry]] = {}
        tasks: list[Entry] = []
        parsed: dict[str, Entry] = {}
        broken = False
        lost_claims = 0
        for item in items:
            message = self._read(item, found)
            if message is None:
                continue
            parsed[item.message_id] = (item, message)
            if message.kind == "entity_task":
                tasks.append((item, message))
            elif message.kind in ("continuation", "shard"):
                ran = await self._range(item, message, options)
                found[item.message_id] = ran
                stopped = None if ran.summary is None else ran.summary.stopped
                broken = broken or stopped_by_breaker(stopped)
            else:
                groups.setdefault((message.job, message.period), []).append((item, message))
        for (name, text), entries in groups.items():
            job = self.jobs[name]
            period = parse_period(job.period, text)
            dispositions, lost = await self._entities(job, period, entries, options)
            found.update(dispositions)
            broken = broken or self.breaker.open
            lost_claims += lost
        if tasks:
            from batchrun.pipeline.tasks import TaskRoad

            road = TaskRoad(
                self.w, self.jobs, self.stop, self.breaker, self.bugs, self.lost_tasks()
            )
            found.update(await road.process(tasks, options))
            broken = broken or self.breaker.open
        return found, broken, lost_claims, parsed

    def _read(self, item: Received, found: dict[str, Disposition]) -> QueueMessage | None:
        """The message, or None with its disposition (poison, an unknown job, paused)."""
        units = {name: job.period for name, job in self.jobs.items()}
        try:
            message = QueueMessage.from_json(item.body, units)
        except UnknownJob as exc:
            # Not poison: a process started with that job's --jobs does it.
            log.info("message %s is for %s: left on the queue", item.message_id, exc)
            delay = max(UNKNOWN_JOB_DELAY_S, self.w.settings.lease_s)
            found[item.message_id] = Disposition(
                "later", str(exc), delay_s=delay, counted=False, unknown_job=exc.job
            )
            return None
        except UnknownFormat as exc:
            # Written by a newer batchrun (a rolling upgrade): kept for a process that
            # reads it, never dead-lettered (a Lambda without a DLQ would drop it).
            log.warning("message %s: %s: left on the queue", item.message_id, exc)
            delay = max(UNKNOWN_JOB_DELAY_S, self.w.settings.lease_s)
            found[item.message_id] = Disposition(
                "later", str(exc), delay_s=delay, counted=False, keep=True, awaited=False
            )
            return None
        except PoisonMessage as exc:
            log.error("poison message %s: %s", item.message_id, exc)
            found[item.message_id] = Disposition("poison", f"poison: {exc}")
            return None
        period = None if message.kind == "entity_task" else message.period
        if self.w.steering.paused(message.job, period) is not None:
            # `batchrun pause`: no new work on the job; the message waits on the queue,
            # kept, whatever its kind: no attempt, and no receive an SQS redrive policy
            # would dead-letter it for, however long the pause. Nothing this worker can
            # do: it holds no --idle-exit (a paused job's task held it for good).
            found[item.message_id] = Disposition(
                "later",
                PAUSED,
                delay_s=self.w.settings.lease_s,
                counted=False,
                keep=True,
                awaited=False,
            )
            return None
        self.working.saw(Scope(message.job, "", period or ""))  # what a cancel may name
        return message

    async def _range(self, item: Received, message: QueueMessage, options: Options) -> Disposition:
        """A continuation or shard: the range (after_id, until_id] of a period, as a run."""
        job = self.jobs[message.job]
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
            self.w,
            self.stop,
            job,
            parse_period(job.period, message.period),
            run_options,
            after=message.after_id,
            until=message.until_id,
        )
        pinned = message.limit is not None and summary.eligible >= message.limit
        if stopped_by_breaker(summary.stopped) and not pinned:
            # What it claimed is queued for retry; the rest of the range waits in this
            # same message for a later delivery. (A limited one claimed its whole share
            # and queued it: delivered again, it would take a second share.)
            delay = max(
                self.w.settings.lease_s,
                backoff_s(
                    item.receive_count,
                    base_s=self.w.settings.retry_base_s,
                    max_s=self.w.settings.retry_max_backoff_s,
                ),
            )
            return Disposition("later", summary.stopped or "", delay_s=delay, summary=summary)
        return Disposition("delete", summary=summary)

    async def _entities(
        self, job: Job, period: Period, entries: list[Entry], options: Options
    ) -> tuple[dict[str, Disposition], int]:
        """Redo the entities the messages name, on the road; one disposition per message,
        and the claims lost."""
        stop = self.stop.child()
        settings = self.w.settings
        try:
            async with Lease(
                self.w.store, lease_s=settings.lease_s, stop=stop, steering=self.w.steering
            ) as lease:
                limiter = await self.limiter(options)
                ctx, _ = self.w.effects.context(
                    job, period, lease=lease, stop=stop, limiter=limiter, breaker=self.breaker
                )
                scope = Scope(job.name, str(ctx.once), str(period))
                writes = LedgerWrites(
                    self.w.store, self.w.queue, lease, summary=None, enqueue=False
                )
                applier = Applier(writes.write)
                worker = EntityWorker(
                    job,
                    ctx,
                    lease=lease,
                    applier=applier,
                    breaker=self.breaker,
                    stop=stop,
                    limiter=limiter,
                    policy=self.w.policy(job),
                    at_once=False,  # a retry's failure backs off (or waits its asked delay)
                    bugs=self.bugs,
                    busy_wait_s=settings.busy_wait_s,
                )
                claims, items, gone = await self._claim(job, ctx, scope, lease, entries)
                try:
                    if items:
                        await prepare(job, ctx, [i.row for i in items])
                    leftover = await travel(
                        each(items),
                        worker,
                        concurrency=options.concurrency,
                        stop=stop,
                        grace_s=options.grace_s,
                        on_progress=options.on_progress,
                    )
                finally:
                    await applier.close()
                await lease.release(scope, [i.id for i in leftover])
                lost = {i.id for i in worker.lost}
                lost_claims = lease.lost_claims
        finally:
            stop.detach()
        found: dict[str, Disposition] = {}
        seen: set[int] = set()
        for received, message in entries:
            uid = message.entity_id
            if uid in seen:
                found[received.message_id] = Disposition("delete", counted=False)  # a duplicate
                continue
            seen.add(uid)
            done = applier.dispositions.get(received.message_id)
            if uid in gone:
                log.info("%s %s: entity %d is not eligible: dropped", job.name, period, uid)
                found[received.message_id] = Disposition("delete", NOT_ELIGIBLE, not_eligible=True)
            elif done is not None and uid not in lost:
                found[received.message_id] = done
            else:
                found[received.message_id] = self._unworked(claims.get(uid), lost=uid in lost)
        return found, lost_claims

    async def _claim(
        self, job: Job, ctx: Any, scope: Scope, lease: Lease, entries: list[Entry]
    ) -> tuple[dict[int, Claim], list[Item], set[int]]:
        """The ledger rows of the entities named, the items claimed (each with the first
        message naming it), and the entities the page does not return."""
        first: dict[int, Received] = {}
        for received, message in entries:
            first.setdefault(message.entity_id, received)
        ids = sorted(first)
        before = await self.w.store.claims_of(scope, ids)
        todo = [u for u in ids if (c := before.get(u)) is None or c.state not in FINAL_STATES]
        claims = dict(before)
        # Re-checked before any claim: an entity the page does not return leaves no trace
        # in the ledger, so a task for the wrong period cannot finish it for its own.
        rows: dict[int, dict[str, Any]] = {}
        try:
            for uid in todo:
                row = await recheck(job, ctx, uid)
                if row is not None:
                    rows[uid] = row
        except LockTimeoutError as exc:
            # The application's table stayed locked (or the work is stopping): as for the
            # ledger's rows below, the messages come back later, none claimed.
            log.warning("%s %s: page locked, retried later: %s", job.name, scope.period, exc)
            return claims, [], set()
        gone = {uid for uid in todo if uid not in rows}
        todo = [uid for uid in todo if uid in rows]
        if not todo:
            return claims, [], gone
        try:
            claims.update(await lease.claim(scope, todo, [u for u in todo if u not in before]))
        except LockTimeoutError as exc:
            # Another session holds these ledger rows: their messages come back later.
            log.warning("%s %s: ledger rows locked, retried later: %s", job.name, scope.period, exc)
            return claims, [], gone
        mine = [
            u for u in todo if claims[u].owner == lease.me and claims[u].state not in FINAL_STATES
        ]
        items = [
            Item(scope, u, rows[u], claims[u].attempts, claims[u].queued, message=first[u])
            for u in mine
        ]
        return claims, items, gone

    def _unworked(self, claim: Claim | None, *, lost: bool) -> Disposition:
        """The disposition of a message whose entity was not worked here."""
        if claim is not None and claim.state in FINAL_STATES and not lost:
            return Disposition("delete", counted=False)  # finished meanwhile: nothing to do
        # Another live run holds the entity, or we stopped first: look again later.
        return Disposition("later", delay_s=self.w.settings.lease_s, counted=False)


def give_back(verdict: Disposition, received: Received, message: QueueMessage) -> Disposition:
    """A busy entity's message, given back: after ``busy_delay_s`` of the times in a row
    it came back busy (its ``busy`` count, and on a FIFO queue its receives since), with
    that count one up in its body; at least what the backend asked for."""
    times = message.busy + max(1, received.receive_count)
    delay = busy_delay_s(times, verdict.delay_s or None)
    body = replace(message, busy=times).to_json()
    return replace(verdict, delay_s=delay, body=body)


__all__ = ["NOT_ELIGIBLE", "Consumer", "Disposition", "give_back"]

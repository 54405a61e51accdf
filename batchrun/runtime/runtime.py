"""The runtime: the wiring. It opens nothing and decides nothing per entity; it hands the
road (batchrun/pipeline/) its collaborators and drives it for a run, a drain, a worker
and the Lambda. It knows no job; the CLI, the Lambda handler and the tests drive it alike."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchrun.control.steering import Steering
from batchrun.db.store import MAX_ID, Store
from batchrun.effects.lender import Effects
from batchrun.errors import MailUnreachableError, NotMigratedError
from batchrun.job import Job
from batchrun.mail.base import Mailer, Message
from batchrun.period import Period
from batchrun.pipeline.apply import Disposition
from batchrun.pipeline.consume import Consumer
from batchrun.pipeline.drain import requeue_unqueued, resend_lost_tasks
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.fanout import fan_out, queue_entities
from batchrun.pipeline.queue_loops import OUTAGE_BACKOFF_S, Chores, QueueLoop
from batchrun.pipeline.reports import FanOut, RetrySummary, Summary
from batchrun.pipeline.run import Options, hand_on, new_summary, run_period
from batchrun.pipeline.wiring import Wiring
from batchrun.policy.retry import RetryPolicy
from batchrun.queue.base import Received, WorkQueue
from batchrun.runtime import inspection, preflight
from batchrun.settings import Settings

log = logging.getLogger(__name__)


class Runtime:
    """Runs jobs (``run``, ``fan_out``, ``submit``) and consumes the queue (``retry``,
    ``serve``, ``process``) on the one road every entity travels."""

    def __init__(
        self,
        jobs: Mapping[str, Job] | Sequence[Job] | Job,
        store: Store,
        mailer: Mailer | None,
        queue: WorkQueue | None,
        settings: Settings,
        *,
        stop: StopToken | None = None,
        templates_dirs: Mapping[str, Path | None] | None = None,
    ) -> None:
        if isinstance(jobs, Job):
            jobs = [jobs]
        if not isinstance(jobs, Mapping):
            jobs = {job.name: job for job in jobs}
        self.jobs: dict[str, Job] = dict(jobs)
        self.store = store
        self.queue = queue
        self.settings = settings
        self.stop = stop or StopToken()
        self.steering = Steering()  # pause / cancel, read at each heartbeat (RunRecord)
        self.effects = Effects(mailer, store, settings, templates_dirs)
        self.wiring = Wiring(store, queue, self.effects, self.steering, settings)
        # One consumer for the runtime's life: its breaker and bug streak span batches.
        self.consumer = Consumer(self.wiring, self.jobs, self.stop)
        self._checked: list[object] = []  # the backends preflight found usable

    @property
    def mailer(self) -> Mailer | None:
        """Where email goes: the effects' mailer (a test may swap it for a watching one)."""
        return self.effects.mailer

    @mailer.setter
    def mailer(self, mailer: Mailer | None) -> None:
        self.effects.mailer = mailer

    @property
    def job(self) -> Job:
        """The first job (the one ``run`` runs when none is named)."""
        return next(iter(self.jobs.values()))

    def policy(self, job: Job, *, run: bool = False) -> RetryPolicy:
        """``job``'s retry policy over the deployment's (see ``Wiring.policy``)."""
        return self.wiring.policy(job, run=run)

    async def preflight(self, job: Job | None = None, queue: WorkQueue | None = None) -> None:
        """Before the first effect: the job's named backends' settings and its tables, the
        retry queue (and ``queue``) and the mailer, each backend once per runtime (see
        runtime/preflight.py)."""
        urls = (self.settings.mail_url, self.settings.retry_queue_url, self.settings.db_url)
        if job is not None:
            self.effects.backends.declare(job)  # its named backends' settings
            await preflight.check_tables(self.store, [job])
        for each in (self.queue, queue):
            if each is not None and not self._was_checked(each):
                await preflight.check_queue(each, *urls)
                self._checked.append(each)
        if self.mailer is not None and not self._was_checked(self.mailer):
            await preflight.check_mailer(self.mailer, *urls)
            self._checked.append(self.mailer)

    def _was_checked(self, backend: object) -> bool:
        return any(backend is done for done in self._checked)

    # -- runs -----------------------------------------------------------------------------

    async def run(
        self,
        period: Period,
        options: Options | None = None,
        *,
        job: Job | str | None = None,
        dry_run: bool = False,
        after: int = 0,
        until: int = MAX_ID,
    ) -> Summary:
        """Run ``job`` (default: the first) over ``period``, ids in (after, until].

        A mail backend that does not answer when the run begins (refused, timed out,
        dropped) is an outage, not a broken setup: once the retry queue has passed its
        check, the run claims nothing and hands the range on to it as a continuation for
        `batchrun retry`; its summary has ``stopped`` (the cause) and ``continuation``, exit
        3. Any other failed check raises.
        """
        which = self._job(job)
        self.effects.compile(which)
        if not dry_run:
            if await self._paused(which, period):
                return paused_summary(which, period)
            started = time.monotonic()
            try:
                await self.preflight(which)
            except MailUnreachableError as exc:
                # The tables and the queue passed (checked first): the period can wait there.
                summary = await hand_on(
                    self.wiring,
                    which,
                    period,
                    options or Options(),
                    str(exc),
                    after=after,
                    until=until,
                )
                if summary is None:
                    raise  # no queue took it: a person must run it again
                summary.duration_s = time.monotonic() - started
                return summary
        # A dry run previews even a paused job, and says it is paused (``"paused": true``):
        # the run it previews would do nothing now.
        held = dry_run and await self._paused(which, period, dry_run=True)
        summary = await run_period(
            self.wiring,
            self.stop,
            which,
            period,
            options or Options(),
            dry_run=dry_run,
            after=after,
            until=until,
        )
        summary.paused = summary.paused or held
        return summary

    async def _paused(self, job: Job, period: Period, *, dry_run: bool = False) -> bool:
        """Whether ``batchrun pause`` holds ``job``'s ``period`` now (read afresh)."""
        await self.steering.refresh(self.store.db)
        held = self.steering.paused(job.name, str(period))
        if held is not None:
            why = f" ({held.reason})" if held.reason else ""
            done = "a run now would do nothing" if dry_run else "nothing done"
            log.info("%s %s is paused%s: %s (`batchrun resume`)", job.name, period, why, done)
        return held is not None

    def _job(self, job: Job | str | None) -> Job:
        if job is None:
            return self.job
        if isinstance(job, str):
            return self.jobs[job]
        return job

    async def fan_out(
        self, period: Period, queue: WorkQueue, *, shard_size: int, job: Job | str | None = None
    ) -> FanOut:
        """Queue the period's unfinished entities as id ranges (shards) for many consumers."""
        return await fan_out(
            self.wiring, self.stop, self._job(job), period, queue, shard_size=shard_size
        )

    async def submit(self, job: Job | str, period: Period, ids: Sequence[int]) -> int:
        """Queue one task per entity for the consumers; return how many were queued.

        Raises:
            UsageError: the job's page does not return some of ``ids`` for ``period``
                (naming them); nothing is queued.
        """
        assert self.queue is not None
        which = self._job(job)
        await self.preflight(which)
        return await queue_entities(self.wiring, self.stop, which, period, ids, self.queue)

    async def status(self, job: Job | str, period: Period, *, problems: int = 50) -> dict[str, Any]:
        """The ledger's counts for the job's period, the job's own (``Job.status``), and the
        first ``problems`` entities not done.

        Raises:
            NotMigratedError: the job's tables (``Job.requires``) are not in the database.
        """
        which = self._job(job)
        missing = await self.store.missing_requirements(which)
        if missing is not None:
            raise NotMigratedError(missing)  # the line migrate printed, not a missing table
        return await inspection.status(self.wiring, which, period, problems=problems)

    async def preview(self, job: Job | str, period: Period, entity_id: int) -> Message:
        """The email ``job`` would send to entity ``entity_id``; nothing claimed or sent."""
        return await inspection.preview(self.wiring, self.stop, self._job(job), period, entity_id)

    # -- the queue ------------------------------------------------------------------------

    async def process(
        self, items: Sequence[Received], options: Options | None = None
    ) -> dict[str, Disposition]:
        """Work on received queue messages; say what to do with each (by message id).

        The caller settles them (``pipeline.apply.settle_messages``): `batchrun retry`
        deletes, hides or dead-letters; the Lambda handler reports its batchItemFailures.
        """
        await self.preflight()
        dispositions, _, _ = await self.consumer.process(items, options or Options())
        return dispositions

    async def retry(
        self,
        options: Options | None = None,
        *,
        max_messages: int = 10_000,
        result: RetrySummary | None = None,
    ) -> RetrySummary:
        """Drain the queue once: redo each entity, delete successes, back off the rest;
        counted into ``result`` if given (what a drain an error ended had done)."""
        assert self.queue is not None and self.mailer is not None
        started = time.monotonic()
        self.declare_backends()
        await self.preflight()
        result = RetrySummary() if result is None else result
        visibility = max(60.0, self.settings.lease_s * 4)
        await self._loop(self.queue).drain(
            options or Options(), result, max_messages=max_messages, visibility_s=visibility
        )
        result.duration_s = time.monotonic() - started
        return result

    async def serve(
        self,
        queue: WorkQueue,
        options: Options | None = None,
        *,
        prefetch: int = 1,
        visibility_s: float = 120.0,
        idle_exit_s: float | None = None,
    ) -> RetrySummary:
        """Consume ``queue`` until stopped (or idle for ``idle_exit_s``): shards, retries,
        tasks and continuations, each message kept invisible while it is worked on. Idle:
        nothing received for ``idle_exit_s``, and every task this worker put back to wait
        for its entity's turn has come back (a retry's own delay does not hold it, nor a
        copy of a failed task's message waiting for its retry time, nor a paused job's).

        A mail outage does not end the worker: it backs off (1 s, doubling to 30 s) and
        polls on, so a supervisor never has to restart it; one at its start (the mail
        server or the queue failing their checks) makes it wait the same way.
        """
        started = time.monotonic()
        result = RetrySummary()
        self.declare_backends()
        checked = await preflight.wait_until_usable(
            lambda: self.preflight(queue=queue), self.stop, max_s=OUTAGE_BACKOFF_S[1]
        )
        if not checked:
            return result  # stopped while the mail server (or the queue) was down
        await self._loop(queue).serve(
            options or Options(),
            result,
            prefetch=prefetch,
            visibility_s=visibility_s,
            idle_exit_s=idle_exit_s,
        )
        result.duration_s = time.monotonic() - started
        return result

    def declare_backends(self) -> None:
        """Every job's named backends' settings, from the environment (a bad variable is a
        ConfigError naming it): `retry` and `worker` check them before they take a message
        they could not work. Not the Lambda's batches: one job's bad setting would fail
        every job's messages there (``process`` works each job's as it comes)."""
        for job in self.jobs.values():
            self.effects.backends.declare(job)

    def _loop(self, queue: WorkQueue) -> QueueLoop:
        chores = Chores(
            self.requeue_unqueued,
            self.resend_lost_tasks,
            lambda: self.steering.refresh(self.store.db),
        )
        return QueueLoop(
            self.consumer, queue, self.effects.backends, chores, self.stop, self.steering
        )

    async def resend_lost_tasks(self, queue: WorkQueue, in_flight: int | None = None) -> int:
        """On an empty queue: the submitted tasks whose message was lost, sent again
        (onto the queue tasks are submitted to only: another's emptiness tells nothing)."""
        if self.queue is None or queue.url != self.queue.url:
            return 0
        return await resend_lost_tasks(
            self.wiring, queue, self.jobs, self.stop, in_flight=in_flight
        )

    async def requeue_unqueued(self) -> int:
        """Queue the temporary failures that a run could not queue (the queue was down)."""
        assert self.queue is not None
        await self.preflight()
        return await requeue_unqueued(self.store, self.queue, self.jobs)


def paused_summary(job: Job, period: Period) -> Summary:
    """The summary of a run that found its job paused: nothing claimed, exit 0."""
    summary = new_summary(job, period, False)
    summary.paused = True
    return summary

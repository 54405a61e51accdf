"""``AsyncHarness``: one job on a temporary database, run by batchrun's own runtime.

A run here is a real run: claims, the ledger, the retry queue (the table in the same
database), suppression, templates and the circuit breaker are batchrun's own; only the
mailer is a ``Mailbox`` that keeps what it is sent. Settings are the defaults, read from
``env`` (never ``os.environ``) with two changes that keep tests short: leases of 2 s and
a failed retry's backoff of 0 (``BATCHRUN_LEASE_S``, ``BATCHRUN_RETRY_BASE_S`` in ``env``
set other values). A delay the job asks for (``Retry(delay_s)``, ``Retry-After``, its own
``RetryPolicy.backoff``) still holds its retry message back.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from batchrun.db import Store, connect
from batchrun.db.base import Database
from batchrun.db.store import Reason, Scope, State
from batchrun.errors import UsageError
from batchrun.job import Context, Job, returned_note
from batchrun.period import Period, containing, current, parse
from batchrun.queue.base import WorkQueue
from batchrun.queue.base import from_url as queue_from_url
from batchrun.registry import check_job, misspelled
from batchrun.runtime import Options, RetrySummary, Runtime, Summary
from batchrun.settings import Settings
from batchrun.task import Task
from batchrun.tasks.submit import Submitted, submit
from batchrun.testing.database import Schema, TemporaryDatabase, run_schema
from batchrun.testing.ledger import STATE_NAMES, LedgerEntry
from batchrun.testing.mailbox import Email, Mailbox

# What the period arguments take: "2025-06" (the job's --period text), a Period, a date
# (the period of the job's unit that contains it), or None (the current one, UTC).
PeriodLike = str | Period | dt.date | None

TEST_ENV = {"BATCHRUN_LEASE_S": "2", "BATCHRUN_RETRY_BASE_S": "0"}


class AsyncHarness:
    """A job, a temporary database with its tables, a mailbox, and batchrun's runtime.

    Use it as ``async with AsyncHarness(MyJob, schema=SQL) as h:`` (or ``await h.open()``
    and ``await h.close()``); ``Harness`` is the same for tests that are not async.

    Args:
        job: the job class (made with no arguments) or an instance.
        db: a database URL; default: a SQLite file in a temporary folder. A server URL
            that names no database gets a new one, dropped at ``close``.
        schema: SQL creating the job's tables (and rows), run before batchrun's
            migrate: one script (split at each ``;``), a list of statements, or a
            mapping from dialect (``"sqlite"``, ``"mysql"``, ``"postgresql"``) to either.
        env: the environment batchrun is configured from: ``ctx.env`` and the
            ``BATCHRUN_*`` settings (``BATCHRUN_FROM``, ``BATCHRUN_UNSUBSCRIBE_URL`` ...).
        templates: a folder of templates overriding the job's own (``--templates``).
        migrate: apply batchrun's schema and the job's own steps (``Job.migrations``)
            after ``schema``, as ``batchrun db migrate`` does.
    """

    def __init__(
        self,
        job: Job | type[Job],
        *,
        db: str | None = None,
        schema: Schema | None = None,
        env: Mapping[str, str] | None = None,
        templates: str | Path | None = None,
        migrate: bool = True,
    ) -> None:
        cls = job if isinstance(job, type) else type(job)
        check_job(cls)  # the contract, as --jobs checks it: one clear line if broken
        for name, meant in misspelled(cls):  # the CLI logs it; a test shows a warning
            warnings.warn(
                f"{cls.__name__}.{name} is nothing batchrun reads: did you mean {meant!r}?",
                UserWarning,
                stacklevel=2,
            )
        self.job: Job = job() if isinstance(job, type) else job
        self.mailbox = Mailbox()
        self._db_url = db
        self._schema = schema
        self._migrate = migrate
        settings = Settings.from_env({**TEST_ENV, **(env or {})})
        self.settings = settings.with_overrides(
            mail_url="discard://", templates_dir=None if templates is None else str(templates)
        )
        self._temp: TemporaryDatabase | None = None
        self._database: Database | None = None
        self._store: Store | None = None
        self._queue: WorkQueue | None = None
        # ctx.count of direct page/prepare/process calls (a run reports its own).
        self._direct = Summary(self.job.name, "", False)

    # -- lifetime -------------------------------------------------------------------------

    async def open(self) -> Self:
        """Make the database, create the tables, migrate, open the queue."""
        if self._store is not None:
            return self
        self._temp = await TemporaryDatabase.make(self._db_url)
        self.settings = self.settings.with_overrides(db_url=self._temp.url)
        try:
            self._database = await connect(self._temp.url, pool_size=4, create=True)
            if self._schema is not None:
                await run_schema(self._database, self._schema)
            store = Store(self._database)
            if self._migrate:
                await store.migrate([self.job])
            self._queue = queue_from_url(
                None, db=self._database, max_receives=self.settings.max_receives
            )
            await self._queue.open()
            self._store = store
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Close the job (``Job.aclose``), the queue and the database; remove the database."""
        try:
            await self.job.aclose()
        finally:
            if self._queue is not None:
                await self._queue.close()
                self._queue = None
            if self._database is not None:
                await self._database.close()
                self._database = None
            self._store = None
            if self._temp is not None:
                await self._temp.remove()
                self._temp = None

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- what a test reads ----------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database's URL."""
        return self.settings.db_url

    @property
    def dialect(self) -> str:
        """The database's SQL dialect: ``"sqlite"``, ``"mysql"`` or ``"postgresql"``."""
        assert self._database is not None, "the harness is not open"
        return self._database.dialect

    @property
    def emails(self) -> list[Email]:
        """Every email accepted so far, in order (``mailbox.messages``)."""
        return self.mailbox.messages

    @property
    def counters(self) -> dict[str, int]:
        """What ``ctx.count`` added in direct ``page`` / ``prepare`` / ``process`` calls."""
        return dict(self._direct.counters)

    def period(self, period: PeriodLike = None) -> Period:
        """The job's period that ``period`` names (None: the current one, UTC)."""
        unit = self.job.period
        if period is None:
            return current(unit)
        if isinstance(period, Period):
            return period
        if isinstance(period, dt.date):
            return containing(unit, period)
        return parse(unit, period)

    async def fetch(self, sql: str, /, **params: Any) -> list[dict[str, Any]]:
        """Run a query on the job's database (``:name`` parameters, as ``ctx.db.fetch``)."""
        return await self._opened().jobdb.fetch(sql, **params)

    async def execute(self, sql: str, /, **params: Any) -> int:
        """Run a statement on the job's database; return the rows it changed."""
        return await self._opened().jobdb.execute(sql, **params)

    async def ledger(self, entity_id: int, period: PeriodLike = None) -> LedgerEntry | None:
        """How entity ``entity_id`` stands in the ledger for ``period``; None: no row yet
        (never claimed, or the run was a dry run)."""
        which = self.period(period)
        once = which.within(self.job.once_unit())
        found = await self._opened().ledger_entry(
            Scope(self.job.name, str(once), str(which)), entity_id
        )
        if found is None:
            return None
        state, attempts, reason = found
        return LedgerEntry(STATE_NAMES[state], attempts, reason)

    async def status(self, period: PeriodLike = None) -> dict[str, Any]:
        """What ``batchrun status JOB`` counts for ``period``: the ledger's counts
        (``succeeded``, ``skipped``, ``retrying``, ``failed_permanent``, ``claimed`` ...),
        the job's own (``Job.status``), and ``problems``: ``{id: LedgerEntry}`` of the
        entities skipped or failed."""
        counts = await self._runtime().status(self.job, self.period(period), problems=10**6)
        counts["problems"] = {
            entity_id: LedgerEntry(STATE_NAMES[State(state)], attempts, reason)
            for entity_id, state, attempts, reason in counts["problems"]
        }
        return counts

    async def suppress(self, address: str, reason: Reason = "manual") -> None:
        """Put ``address`` on the suppression list, as ``batchrun suppress add`` does."""
        await self._opened().suppress(address, reason=reason, source="batchrun.testing")

    # -- runs -----------------------------------------------------------------------------

    async def run(
        self,
        period: PeriodLike = None,
        *,
        limit: int | None = None,
        concurrency: int = 4,
        page_size: int = 500,
    ) -> Summary:
        """``batchrun run JOB --period P``: the summary (``.succeeded``, ``.skipped``,
        ``.failed``, ``.emails_sent``, each ``ctx.count`` counter, ``.to_json()``)."""
        options = Options(concurrency=concurrency, page_size=page_size, limit=limit)
        return await self._runtime().run(self.period(period), options, job=self.job)

    async def dry_run(
        self, period: PeriodLike = None, *, limit: int | None = None, page_size: int = 500
    ) -> Summary:
        """``batchrun run JOB --period P --dry-run``: ``page`` only, nothing written or
        sent; ``eligible`` and ``skipped`` (invalid or suppressed ``Job.address``) counted."""
        options = Options(page_size=page_size, limit=limit)
        return await self._runtime().run(self.period(period), options, job=self.job, dry_run=True)

    async def retry(self, *, max_messages: int = 10_000, concurrency: int = 4) -> RetrySummary:
        """``batchrun retry``: one drain of the retry queue (``.processed``, ``.succeeded``,
        ``.failed``, ``.dead_lettered``, ``.remaining``). The kit retries without backoff,
        so a failure is back on the queue at once and the same drain takes it again: one
        call works each entity until it succeeds or is dead-lettered, and counts every
        attempt (``processed`` 5 for one entity failing 5 times)."""
        options = Options(concurrency=concurrency)
        return await self._runtime().retry(options, max_messages=max_messages)

    async def submit(
        self, entity_id: int, data: dict[str, Any] | None = None, key: str | None = None
    ) -> Submitted:
        """For a task job (``batchrun.Task``): ``batchrun submit JOB ID``, what an
        application's ``client.submit`` does: the task recorded and queued (``.key``;
        ``.queued`` False for a key submitted before). ``retry()`` then works it, as a
        ``batchrun worker`` would, each entity's tasks in the order submitted."""
        if not isinstance(self.job, Task):
            raise UsageError(
                f"{self.job.name} is not a task job: run() works its entities per period"
            )
        self._opened()
        assert self._database is not None and self._queue is not None
        return await submit(
            self._database,
            self._queue,
            self.job,
            entity_id,
            data,
            key,
            resend_after_s=self.settings.task_resend_s,
        )

    async def preview(self, entity_id: int, period: PeriodLike = None) -> Email:
        """``batchrun preview JOB --id N``: the email ``process`` would send the entity,
        nothing claimed, written or sent. A ``UsageError`` when the page does not return
        the entity, ``process`` skips it, or sends it nothing."""
        message = await self._runtime().preview(self.job, self.period(period), entity_id)
        return Email.from_message(message)

    # -- the job's own methods, called directly ---------------------------------------------

    async def page(
        self, period: PeriodLike = None, *, after: int = 0, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The job's ``page(ctx, after, limit)`` for ``period``, as the runtime calls it."""
        return await self.job.page(self._context(period), after, limit)

    async def prepare(self, rows: list[dict[str, Any]], period: PeriodLike = None) -> None:
        """The job's ``prepare(ctx, rows)``, once; it may add keys to ``rows``."""
        await self.job.prepare(self._context(period), rows)

    async def process(self, row: dict[str, Any], period: PeriodLike = None) -> None:
        """The job's ``process`` for one row (its ``id`` sets ``ctx.key``), outside a run:
        no claim, no ledger. What it raises comes out as it is (``Skip``, ``Retry``,
        ``Fail``, a mail error; a busy backend's ``Busy``, at once: nothing waits here);
        what it sends lands in the mailbox."""
        runtime = self._runtime()
        async with runtime.effects.backends.session():  # ctx.http's clients, closed after
            entity = self._context(period, runtime).entity(row["id"])
            returned = await self.job.process(entity, row)  # type: ignore[func-returns-value]
            entity.check_awaited()  # a send_email without await: NotAwaitedError
        if returned is not None:  # `return False` is no failure: the author's test says so
            warnings.warn(returned_note(self.job.name, returned), UserWarning, stacklevel=2)

    def _context(self, period: PeriodLike, runtime: Runtime | None = None) -> Context:
        runtime = runtime or self._runtime()
        ctx, _ = runtime.effects.context(
            self.job, self.period(period), stop=runtime.stop, summary=self._direct
        )
        return ctx

    def _runtime(self) -> Runtime:
        store = self._opened()
        return Runtime(self.job, store, self.mailbox, self._queue, self.settings)

    def _opened(self) -> Store:
        if self._store is None:
            raise RuntimeError(
                "the harness is not open: `async with AsyncHarness(...) as h`, or `await h.open()`"
            )
        return self._store


__all__ = ["AsyncHarness", "PeriodLike"]

"""``Harness``: ``AsyncHarness`` for plain (not async) tests, on an event loop of its own.

Every method is the async harness's, run to completion on the harness's loop, so a plain
``def test_...`` needs no asyncio plugin. Its loop is its own: call it from a sync test or
fixture, not from inside a running event loop (an ``async def`` test uses ``AsyncHarness``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from batchrun.db.store import Reason
from batchrun.job import Job
from batchrun.period import Period
from batchrun.runtime import RetrySummary, Summary
from batchrun.tasks.submit import Submitted
from batchrun.testing.database import Schema
from batchrun.testing.harness import AsyncHarness, PeriodLike
from batchrun.testing.ledger import LedgerEntry
from batchrun.testing.mailbox import Email, Mailbox

T = TypeVar("T")


class Harness:
    """A job on a temporary database with a mailbox: ``AsyncHarness``, synchronously.

    It is open once made; ``with Harness(MyJob, schema=SQL) as h:`` closes it at the end
    (or call ``close``). The arguments are ``AsyncHarness``'s.
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
        self._runner = asyncio.Runner()
        self._async = AsyncHarness(
            job, db=db, schema=schema, env=env, templates=templates, migrate=migrate
        )
        try:
            self._call(self._async.open())
        except BaseException:
            self._runner.close()
            raise

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coroutine)

    def close(self) -> None:
        """Close the job, the queue and the database; remove the database."""
        try:
            self._call(self._async.close())
        finally:
            self._runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def job(self) -> Job:
        """The job instance the harness runs."""
        return self._async.job

    @property
    def mailbox(self) -> Mailbox:
        """The capturing mailer: ``messages``, ``attempts``, ``fail(...)``, ``recover()``."""
        return self._async.mailbox

    @property
    def emails(self) -> list[Email]:
        """Every email accepted so far, in order."""
        return self._async.emails

    @property
    def counters(self) -> dict[str, int]:
        """What ``ctx.count`` added in direct ``page`` / ``prepare`` / ``process`` calls."""
        return self._async.counters

    @property
    def dialect(self) -> str:
        """The database's SQL dialect: ``"sqlite"``, ``"mysql"`` or ``"postgresql"``."""
        return self._async.dialect

    @property
    def url(self) -> str:
        """The database's URL."""
        return self._async.url

    def period(self, period: PeriodLike = None) -> Period:
        """The job's period that ``period`` names (None: the current one, UTC)."""
        return self._async.period(period)

    def fetch(self, sql: str, /, **params: Any) -> list[dict[str, Any]]:
        """Run a query on the job's database (``:name`` parameters, as ``ctx.db.fetch``)."""
        return self._call(self._async.fetch(sql, **params))

    def execute(self, sql: str, /, **params: Any) -> int:
        """Run a statement on the job's database; return the rows it changed."""
        return self._call(self._async.execute(sql, **params))

    def ledger(self, entity_id: int, period: PeriodLike = None) -> LedgerEntry | None:
        """How entity ``entity_id`` stands in the ledger for ``period`` (None: no row)."""
        return self._call(self._async.ledger(entity_id, period))

    def status(self, period: PeriodLike = None) -> dict[str, Any]:
        """What ``batchrun status JOB --json`` counts for ``period``."""
        return self._call(self._async.status(period))

    def suppress(self, address: str, reason: Reason = "manual") -> None:
        """Put ``address`` on the suppression list."""
        self._call(self._async.suppress(address, reason))

    def run(
        self,
        period: PeriodLike = None,
        *,
        limit: int | None = None,
        concurrency: int = 4,
        page_size: int = 500,
    ) -> Summary:
        """``batchrun run JOB --period P``: the run's summary."""
        return self._call(
            self._async.run(period, limit=limit, concurrency=concurrency, page_size=page_size)
        )

    def dry_run(
        self, period: PeriodLike = None, *, limit: int | None = None, page_size: int = 500
    ) -> Summary:
        """``batchrun run JOB --period P --dry-run``: the dry run's summary."""
        return self._call(self._async.dry_run(period, limit=limit, page_size=page_size))

    def retry(self, *, max_messages: int = 10_000, concurrency: int = 4) -> RetrySummary:
        """``batchrun retry``: one drain of the retry queue, its summary."""
        return self._call(self._async.retry(max_messages=max_messages, concurrency=concurrency))

    def submit(
        self, entity_id: int, data: dict[str, Any] | None = None, key: str | None = None
    ) -> Submitted:
        """For a task job: ``batchrun submit JOB ID``, one task recorded and queued
        (``.key``, ``.queued``); ``retry()`` works it."""
        return self._call(self._async.submit(entity_id, data, key))

    def preview(self, entity_id: int, period: PeriodLike = None) -> Email:
        """``batchrun preview JOB --id N``: the email the entity would get."""
        return self._call(self._async.preview(entity_id, period))

    def page(
        self, period: PeriodLike = None, *, after: int = 0, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The job's ``page(ctx, after, limit)`` for ``period``."""
        return self._call(self._async.page(period, after=after, limit=limit))

    def prepare(self, rows: list[dict[str, Any]], period: PeriodLike = None) -> None:
        """The job's ``prepare(ctx, rows)``, once."""
        self._call(self._async.prepare(rows, period))

    def process(self, row: dict[str, Any], period: PeriodLike = None) -> None:
        """The job's ``process`` for one row, outside a run (no claim, no ledger)."""
        self._call(self._async.process(row, period))


__all__ = ["Harness"]

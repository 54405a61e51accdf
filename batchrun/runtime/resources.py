"""Open the database, mailer and retry queue a command needs, from settings; close them all."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from batchrun import schemes
from batchrun.db import Store, connect
from batchrun.errors import UsageError
from batchrun.job import Job
from batchrun.mail.base import Mailer
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.mail.dkim import signer_for
from batchrun.mail.message import sender_problem
from batchrun.queue.base import WorkQueue
from batchrun.queue.base import check_url as check_queue_url
from batchrun.queue.base import from_url as queue_from_url
from batchrun.settings import Settings
from batchrun.urls import scheme_of

# A schema found migrated, by (database URL, jobs): when, on the monotonic clock. A warm
# Lambda opens the database for every SQS batch, and the check is some 70 statements (33
# ms on loopback); migrations only add, so what held a moment ago still holds. Checked
# again after SCHEMA_CHECKED_S, and by every new process.
SCHEMA_CHECKED_S = 300.0
_schema_checked: dict[tuple[str, tuple[str, ...]], float] = {}


def _schema_key(url: str, jobs: Sequence[Job]) -> tuple[str, tuple[str, ...]]:
    return url, tuple(sorted(job.name for job in jobs))


def schema_checked_lately(url: str, jobs: Sequence[Job]) -> bool:
    """Whether this process found ``jobs``' schema migrated on ``url`` in the last
    ``SCHEMA_CHECKED_S`` seconds."""
    at = _schema_checked.get(_schema_key(url, jobs))
    return at is not None and time.monotonic() - at < SCHEMA_CHECKED_S


def note_schema_checked(url: str, jobs: Sequence[Job]) -> None:
    _schema_checked[_schema_key(url, jobs)] = time.monotonic()


@dataclass
class Backends:
    """What a command works with; mailer and queue are None when it does not need them."""

    store: Store
    mailer: Mailer | None
    queue: WorkQueue | None


def check_urls(settings: Settings, *, mail: bool, queue: bool = False) -> None:
    """Reject unknown schemes before connecting to anything (a usage error, exit 2):
    the database's always, the mailer's (and --from) with ``mail``, the retry queue's
    with ``queue``."""
    if schemes.find("db", settings.db_url) is None:
        raise UsageError(
            f"unknown --db URL scheme {scheme_of(settings.db_url) or '(none)'!r}: use "
            f"{schemes.forms('db')}"
        )
    if mail and settings.sender is not None:
        problem = sender_problem(settings.sender)
        if problem is not None:
            raise UsageError(f"--from {settings.sender!r} {problem}")
    if mail and schemes.find("mail", settings.mail_url) is None:
        raise UsageError(
            f"unknown --mail URL scheme {scheme_of(settings.mail_url) or '(none)'!r}: "
            f"use one of {schemes.accepted('mail')}"
        )
    if queue:
        check_queue_url(settings.retry_queue_url)


def _ses_env(settings: Settings) -> dict[str, str]:
    """The SES configuration set the mailer sends with, when one is named."""
    name = settings.environ.get("BATCHRUN_SES_CONFIGURATION_SET")
    return {"BATCHRUN_SES_CONFIGURATION_SET": name} if name else {}


async def open_queue(
    settings: Settings, url: str | None, store: Store, *, concurrency: int
) -> WorkQueue:
    """The queue at ``url`` (None: the table in the job's database), opened.

    Opening fails here, before any mail is sent, on a missing queue or bad credentials.
    """
    queue = queue_from_url(
        url,
        db=store.db,
        max_receives=settings.max_receives,
        env=settings.extra,
        concurrency=concurrency,
    )
    try:
        await queue.open()
    except BaseException:
        await queue.close()  # a client made before the queue was found missing
        raise
    return queue


@contextlib.asynccontextmanager
async def open_backends(
    settings: Settings,
    *,
    mail: bool = False,
    queue: bool = False,
    concurrency: int = 4,
    create: bool = False,
    migrated: bool = True,
    jobs: Sequence[Job] = (),
) -> AsyncIterator[Backends]:
    """Open what a command needs; everything opened is closed on the way out.

    ``migrated``: check that batchrun's schema and the steps of ``jobs`` are all there.
    """
    check_urls(settings, mail=mail)
    # Read and tried before anything connects: a bad key is a config error, exit 2.
    dkim = signer_for(settings, jobs[0].sender_address() if jobs else None) if mail else None
    # The page reader, the group commit, the heartbeat and a spare: the workers send mail,
    # they do not hold database connections.
    database = await connect(
        settings.db_url,
        pool_size=4,
        create=create,
        busy_timeout=min(5.0, settings.lease_s / 3),
    )
    mailer: Mailer | None = None
    retry_queue: WorkQueue | None = None
    try:
        store = Store(database)
        if migrated and not schema_checked_lately(settings.db_url, jobs):
            await store.check_migrated(jobs)
            note_schema_checked(settings.db_url, jobs)
        if queue:
            retry_queue = await open_queue(
                settings, settings.retry_queue_url, store, concurrency=concurrency
            )
        if mail:
            mailer = mailer_from_url(
                settings.mail_url,
                timeout=settings.mail_timeout_s,
                pool_size=concurrency,
                env={**settings.extra, **_ses_env(settings)},
                dkim=dkim,
            )
        yield Backends(store, mailer, retry_queue)
    finally:
        if mailer is not None:
            await mailer.close()
        if retry_queue is not None:
            await retry_queue.close()
        await database.close()

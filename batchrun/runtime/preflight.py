"""Preflight: before a run has any effect, check what it will use.

The job's email templates (compiled), its tables (``Job.requires``), the retry queue (its
table, or the SQS queue and its dead-letter queue) and the mailer (an SMTP session opened
and closed, the outbox writable, SES answering). A broken setup then costs one line naming
the part and the cause, exit 1, with nothing claimed, created or queued, instead of a card
and a queued retry per entity and the cause buried in ``batchrun status``::

    mail: cannot write to notadir: Not a directory
    mail: smtp://127.0.0.1:2599 refused the login: 535 5.7.8 authentication failed
    retry queue: could not read the attributes of SQS queue http://...: ...

A mail server that does not answer (refused, timed out, dropped: MailUnreachableError) is
an outage, not a broken setup: a run hands its period on to the retry queue instead (exit
3, ``Runtime.run``), once the queue's own check has passed::

    mail: cannot connect to smtp://127.0.0.1:2599: Connection refused

The checks write nothing but a file outbox's directory (and a probe file removed at
once), which is why a dry run, which sends nothing, checks the tables and the queue only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from batchrun.db.store import Store
from batchrun.errors import (
    BatchrunError,
    MailConnectionError,
    MailUnreachableError,
    NotMigratedError,
    QueueError,
)
from batchrun.job import Job
from batchrun.mail.base import Mailer
from batchrun.queue.base import WorkQueue
from batchrun.urls import mask_text

if TYPE_CHECKING:
    from batchrun.pipeline.engine import StopToken

log = logging.getLogger(__name__)


async def check_tables(store: Store, jobs: Iterable[Job]) -> None:
    """Raise NotMigratedError naming the tables and columns a job needs that are missing."""
    for job in jobs:
        missing = await store.missing_requirements(job)
        if missing is not None:
            raise NotMigratedError(missing)


async def check_queue(queue: WorkQueue, *urls: str | None) -> None:
    """Raise QueueError (``retry queue: <cause>``) unless ``queue`` can be used now.

    ``urls``: the settings' URLs, whose passwords are masked in the line.
    """
    try:
        await queue.check()
    except BatchrunError as exc:
        raise QueueError(mask_text(f"retry queue: {exc}", *urls)) from exc


async def check_mailer(mailer: Mailer, *urls: str | None) -> None:
    """Raise MailConnectionError (``mail: <cause>``) unless ``mailer`` can send now: its
    MailUnreachableError when nothing answers (an outage, not a setup to fix).

    A mailer without ``check`` (a wrapper a test or an application made) is trusted.
    """
    check = getattr(mailer, "check", None)
    if check is None:
        log.debug("mailer %r has no check(): not checked before the run", mailer)
        return
    try:
        await check()
    except BatchrunError as exc:
        down = isinstance(exc, MailUnreachableError)  # an outage: kept apart (Runtime.run)
        error = MailUnreachableError if down else MailConnectionError
        raise error(mask_text(f"mail: {exc}", *urls)) from exc


async def wait_until_usable(
    check: Callable[[], Awaitable[None]],
    stop: StopToken,
    *,
    first_s: float = 1.0,
    max_s: float = 30.0,
) -> bool:
    """Run ``check`` until it passes: while it raises MailConnectionError or QueueError
    (the mail server or the queue is down), wait ``first_s``, doubling up to ``max_s``, and
    try again. One log line when it starts failing (and per new cause), one when it passes
    again. False when ``stop`` came first. A worker starts this way: a supervisor need not
    restart it until the mail server is up.
    """
    pause = first_s
    failing: str | None = None
    while True:
        try:
            await check()
        except (MailConnectionError, QueueError) as exc:
            if str(exc) != failing:
                failing = str(exc)
                log.warning("%s; waiting for it (checking again up to every %.0f s)", exc, max_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait_stopping(), timeout=pause)
            if stop.stopping:
                return False
            pause = min(max_s, pause * 2)
            continue
        if failing is not None:
            log.warning("the checks pass again: serving")
        return True

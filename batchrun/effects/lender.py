"""The effects a run lends its contexts: one mailer, the jobs' templates, the suppression
list and the pacers, behind ``Effects.context``. The road asks for contexts here; it never
holds the mailer or the templates itself."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from batchrun import schemes
from batchrun.effects.backends import BackendPool
from batchrun.effects.sending import Sender, make_limiter
from batchrun.errors import ConfigError
from batchrun.job import Context, Job
from batchrun.period import Period
from batchrun.policy.pacing import CircuitBreaker
from batchrun.policy.rate import AdaptiveRate

if TYPE_CHECKING:
    from batchrun.db.store import Store
    from batchrun.mail.base import Mailer
    from batchrun.pipeline.lease import Lease
    from batchrun.pipeline.reports import Summary
    from batchrun.pipeline.stop import StopToken
    from batchrun.settings import Settings
    from batchrun.templates import Templates

log = logging.getLogger(__name__)


class Effects:
    """Contexts for the jobs' methods, each with its effects (see ``context``).

    Args:
        mailer: where email goes (None: a command that sends none).
        store: the suppression list, and ``ctx.db`` (the job's database).
        settings: the From, unsubscribe, templates folder and environment.
        templates_dirs: a job's own templates folder, by job name, when the registry
            found one beside its module.
    """

    def __init__(
        self,
        mailer: Mailer | None,
        store: Store,
        settings: Settings,
        templates_dirs: Mapping[str, Path | None] | None = None,
    ) -> None:
        self.mailer = mailer
        self.store = store
        self.settings = settings
        self._templates_dirs = dict(templates_dirs or {})
        self._templates: dict[str, Templates] = {}
        self._warned_unsubscribe = False
        # The jobs' named backends: gates for the runtime's life, clients per session.
        self.backends = BackendPool(settings, getattr(store, "db", None))  # None: no store

    def templates(self, job: Job) -> Templates:
        """The job's templates (``--templates``, its own folder, batchrun's), compiled once.

        Raises:
            ConfigError: ``--templates`` names no folder (exit 2, before anything is sent).
        """
        found = self._templates.get(job.name)
        if found is None:
            from batchrun.templates import DEFAULTS, Templates, job_folder

            folder = self._templates_dirs.get(job.name) or job_folder(job)
            override = self.settings.templates_dir
            if override is not None and not Path(override).is_dir():
                raise ConfigError(f"--templates (BATCHRUN_TEMPLATES) {override}: no such folder")
            found = Templates([p for p in (override, folder, DEFAULTS) if p is not None])
            self._templates[job.name] = found
        return found

    def compile(self, job: Job) -> None:
        """Compile every template ``job`` has, before anything is claimed or sent (see
        ``templates.compile_job``)."""
        from batchrun.templates import compile_job

        folder = self._templates_dirs.get(job.name)
        compile_job(self.templates(job), job, folder, self.settings.templates_dir)

    async def limiter(self, rate: float | Literal["auto"] | None) -> AdaptiveRate | None:
        """The pacer for ``--rate`` (``auto``: from the mail provider's own limit)."""
        return await make_limiter(self.mailer, rate)

    def context(
        self,
        job: Job,
        period: Period,
        *,
        stop: StopToken,
        summary: Summary | None = None,
        lease: Lease | None = None,
        limiter: AdaptiveRate | None = None,
        breaker: CircuitBreaker | None = None,
        dry_run: bool = False,
    ) -> tuple[Context, Sender]:
        """A context for ``job``'s ``period``, and its effects: email through the mailer
        (none in a dry run), counted in ``summary``, fenced by ``lease``, every effect
        paced by ``limiter`` and stopped by ``breaker``; the job's named backends
        (``ctx.backend``, ``ctx.http``) through ``backends``."""
        if not dry_run:
            self.backends.declare(job)
        sender = Sender(
            None if dry_run else self.mailer,
            self.settings,
            summary=summary,
            lease=lease,
            stop=stop,
            limiter=limiter,
            templates=None if dry_run else self.templates(job),
            store=self.store,
            sender=self.settings.sender_for(job),
            breaker=breaker,
            backends=None if dry_run else self.backends,
        )
        if not dry_run:
            self.warn_without_unsubscribe()
        ctx = Context(
            job, period, self.store.jobdb, sender, dry_run=dry_run, env=self.settings.environ
        )
        return ctx, sender

    def warn_without_unsubscribe(self) -> None:
        """Once: mail to real mailboxes (SMTP, SES) without one-click unsubscribe."""
        if self._warned_unsubscribe or self.settings.unsubscribe_secret is not None:
            return
        if schemes.can(self.settings.mail_url, "mailbox"):
            self._warned_unsubscribe = True
            log.warning(
                "emails go out without one-click unsubscribe: Gmail and Yahoo require it of "
                "bulk senders; set BATCHRUN_UNSUBSCRIBE_URL and BATCHRUN_UNSUBSCRIBE_SECRET"
            )


class NoEffects:
    """The effects of a context that must not act (``status``): it may read the list."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def send_email(self, ctx: Context, **fields: Any) -> None:
        raise RuntimeError("no email from here")

    async def suppressed(self, addresses: Iterable[str]) -> dict[str, str]:
        return await self.store.suppressed(addresses)

    def count(self, name: str, n: int) -> None:
        pass

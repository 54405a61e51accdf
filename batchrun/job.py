"""The contract a job is written against: ``Job`` and ``Context`` (the verdicts it raises
are in ``batchrun/verdicts.py``, and importable from here as before).

A job is two methods, the way Shopify's job-iteration has ``build_enumerator`` and
``each_iteration``: ``page`` says which entities there are, ``process`` does one. batchrun
owns everything else: the cursor, claims and leases, the ledger that makes each entity
happen once per ``once_per`` period, pacing, retries, hand-offs and the summary.

    class Renewal(batchrun.Job):
        name = "renewal"
        period = "day"

        async def page(self, ctx, after, limit):
            return await ctx.db.fetch("SELECT id, email FROM account WHERE ... AND id > :after "
                                      "ORDER BY id LIMIT :limit", after=after, limit=limit)

        async def process(self, ctx, row):
            await ctx.send_email(to=row["email"], subject="...", text="...")
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from batchrun.awaited import Awaited
from batchrun.db.sql import SqlFolder
from batchrun.period import Period, Unit
from batchrun.policy.retry import RetryPolicy
from batchrun.verdicts import Busy, Fail, Retry, Skip, Verdict

if TYPE_CHECKING:
    import httpx

    from batchrun.backend import Backend

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# db explain's answer: (label, the database's plan rows) per query, and a one-line verdict.
Explained = tuple[list[tuple[str, list[dict[str, Any]]]], str]


class ContextDb(Protocol):
    """``ctx.db``: the job's database, with ``:name`` parameters always bound by the driver.

    A list parameter expands for ``IN :ids``.
    """

    dialect: str

    async def fetch(self, sql: str, /, **params: Any) -> list[dict[str, Any]]: ...

    async def execute(self, sql: str, /, **params: Any) -> int: ...


class ContextEffects(Protocol):
    """What the runtime lends a context: the mail path, the suppression list, the counters."""

    async def send_email(self, ctx: Context, **fields: Any) -> None: ...

    async def suppressed(self, addresses: Iterable[str]) -> dict[str, str]: ...

    def count(self, name: str, n: int) -> None: ...


class Context:
    """What a job's methods are given: the period, the database and the ways to act.

    ``env`` is the environment batchrun was configured from (a job's own settings live
    there too). In ``process``, ``key`` is the entity's stable idempotency key
    ``"{job}:{once_per period}:{id}"``: for a UNIQUE column, an HTTP ``Idempotency-Key``
    or a Message-ID. Outside ``process`` it is empty.
    """

    __slots__ = (
        "_effects",
        "_key_prefix",
        "_sends",
        "db",
        "dry_run",
        "env",
        "id",
        "job",
        "key",
        "once",
        "period",
    )

    def __init__(
        self,
        job: Job,
        period: Period,
        db: ContextDb,
        effects: ContextEffects,
        *,
        dry_run: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.job = job
        self.period = period
        self.once = period.within(job.once_unit())  # the period "exactly once" counts in
        self.db = db
        self.dry_run = dry_run
        self.env: Mapping[str, str] = env or {}  # the environment batchrun was configured from
        self.key = ""
        self.id: int | None = None
        self._effects = effects
        self._key_prefix = f"{job.name}:{self.once}:"  # each entity's key but its id
        self._sends: list[Awaited] | None = None  # send_email's, to check they were awaited

    def entity(self, entity_id: int) -> Context:
        """The context of one entity: the same run, with ``key`` and ``id`` set."""
        child = Context.__new__(Context)
        child.job, child.period, child.once = self.job, self.period, self.once
        child.db, child.dry_run, child._effects = self.db, self.dry_run, self._effects
        child.env, child._key_prefix = self.env, self._key_prefix
        child.id = entity_id
        child.key = f"{self._key_prefix}{entity_id}"
        child._sends = None
        return child

    def check_awaited(self) -> None:
        """Raise ``NotAwaitedError`` if ``process`` called ``send_email`` without await
        (that email never went out)."""
        Awaited.forgotten(self._sends)

    def sql(self, name: str) -> str:
        """The job's named query ``name`` for this database's dialect (``Job.sql``)."""
        if self.job.sql is None:
            raise LookupError(f"job {self.job.name!r} has no sql folder")
        return self.job.sql.text(self.db.dialect, name)

    def send_email(
        self,
        to: str,
        subject: str | None = None,
        text: str | None = None,
        html: str | None = None,
        to_name: str | None = None,
        template: str | None = None,
        **variables: Any,
    ) -> Awaitable[None]:
        """Send one email through the configured mailer, rate limit and circuit breaker.

        Either ``subject`` and ``text`` (``html`` optional), or a ``template`` whose
        ``subject.txt``, ``body.txt`` and ``body.html`` are rendered with ``variables``.
        Its Message-ID and ``X-Batchrun-Id`` derive from ``key``; with one-click
        unsubscribe configured it carries ``List-Unsubscribe`` and the templates get
        ``unsubscribe_url``. Raises ``Skip`` for an address that fails a plain syntax
        check, and ``Skip("suppressed: <reason>")`` for one on the suppression list.
        Awaited, as a coroutine is: one not awaited fails the entity (``NotAwaitedError``).
        """
        send = Awaited(
            self._effects.send_email(
                self,
                to=to,
                subject=subject,
                text=text,
                html=html,
                to_name=to_name,
                template=template,
                variables=variables,
            ),
            "ctx.send_email(...)",
        )
        if self.id is not None:  # an entity's (prepare's run-wide context keeps none)
            if self._sends is None:
                self._sends = []
            self._sends.append(send)
        return send

    async def suppressed(self, addresses: Iterable[str]) -> dict[str, str]:
        """The addresses among ``addresses`` that are on the suppression list, each with
        its reason (``unsubscribe``, ``bounce``, ``complaint`` or ``manual``).

        Domains compare case-insensitively. Call it in ``prepare`` to leave suppressed
        entities out of batched effects (the birthday job creates no card for them) and
        skip them in ``process`` with ``Skip(f"suppressed: {reason}")``. One query for the
        whole list, and none for addresses already looked up: batchrun looks up each
        page's ``email`` column before ``prepare``, and ``send_email`` reuses the answers.
        """
        return await self._effects.suppressed(addresses)

    def paced(self) -> AbstractAsyncContextManager[None]:
        """Hold one call to an outside service (an HTTP API, say) through the run's pacer:
        ``--rate`` and its AIMD, the circuit breaker, as ``send_email`` is.

            async with ctx.paced():
                response = await client.post("/grants", json=body)
                response.raise_for_status()

        An httpx error leaving the block is raised as the verdict it means (``Retry`` for
        a connection failure, a timeout, HTTP 408, 429 with its ``Retry-After`` as
        ``delay_s``, 5xx; ``Fail`` for any other 4xx); a 429 also halves the rate, and
        connection failures in a row open the breaker, which stops the run and queues the
        rest. A call while the breaker is open raises ``Retry`` without starting.
        """
        paced = getattr(self._effects, "paced", None)
        if paced is None:  # effects a test made: no rate, a breaker that never opens
            from batchrun.policy.pacing import CircuitBreaker, Pacer

            return Pacer(None, CircuitBreaker(threshold=2**62)).call()
        manager: AbstractAsyncContextManager[None] = paced()
        return manager

    def backend(self, name: str) -> AbstractAsyncContextManager[None]:
        """Hold one call to the backend ``name`` (``Job.backends``): its breaker, its
        ``ready`` probe, a slot of its ``concurrency``, its ``rate``.

            async with ctx.backend("encoder"):
                await encoder.submit(task.data)

        Busy (not ready, no slot) waits: in a run until the backend is free (or the run
        stops), in a consumer for ``BATCHRUN_BUSY_WAIT_S`` at most, then raises ``Busy``
        and the entity goes back to the queue, no attempt counted. Raise ``Busy`` in the
        block for a busy answer (an httpx 429 or 503 leaving it is one); an httpx error
        leaving it is raised as the verdict it means, as in ``paced()``. Connection
        failures in a row open the backend's breaker, which stops the run and queues the
        rest.
        """
        manager: AbstractAsyncContextManager[None] = self._lent("backend")(self, name)
        return manager

    def http(self, name: str) -> httpx.AsyncClient:
        """An ``httpx.AsyncClient`` whose every request goes through the backend ``name``
        (``ctx.backend``), its base URL ``BATCHRUN_BACKEND_<NAME>_URL``.

            response = await ctx.http("credits").post("/grants", json=body)
            response.raise_for_status()

        An answer 429 or 503 is ``Busy`` (its ``Retry-After`` honoured; the rate slows
        when it is ``auto``); call ``raise_for_status()`` for the rest, which batchrun
        classifies (5xx, 408: retry; other 4xx: fail). The client is batchrun's (one per
        backend, closed by batchrun): do not close it or keep it past ``process``. Needs
        httpx (``pip install 'batchrun[http]'``).
        """
        client: httpx.AsyncClient = self._lent("http")(self, name)
        return client

    def _lent(self, what: str) -> Any:
        found = getattr(self._effects, what, None)
        if found is None:  # effects a test made
            raise RuntimeError(f"ctx.{what}() is not available in this context")
        return found

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``, reported as a key of the run's JSON summary."""
        self._effects.count(name, n)


def returned_note(job: str, value: object) -> str:
    """What to say of a ``process`` that returned a value (``return False`` reads as a
    failure to its author; to batchrun, which reads no return value, it is a success)."""
    return (
        f"job {job!r}: process() returned {value!r:.40}, which batchrun ignores: the entity "
        "counts as done; raise batchrun.Skip, Retry or Fail to say otherwise"
    )


class Job:
    """A batch job: subclass it, set ``name``, write ``page`` and ``process``.

    Class attributes:
        name: ``[a-z][a-z0-9_-]{0,31}``; part of every ledger and idempotency key.
        period: what ``--period`` takes: ``"year"``, ``"month"`` or ``"day"``.
        once_per: the unit "exactly once" counts in (default: ``period``); at least as
            long as ``period``.
        description: one line for ``batchrun jobs``.
        sql: the job's named queries (``SqlFolder``); statements named ``migrate_*``
            are its schema steps, applied by ``batchrun db migrate``.
        migrations: a ``SqlFolder`` of the schema steps, when they live apart from ``sql``.
        templates: the folder of the job's email templates (default: ``templates/``
            beside the job's module).
        requires: table -> columns the job needs; ``run`` stops before claiming
            anything when one is missing.
        counters: the ``ctx.count`` names, reported (0 when unused) in every summary.
        address: the page column that holds the recipient's email address (default
            ``"email"``): batchrun looks each page's addresses up on the suppression list
            before ``prepare``, and a dry run counts an invalid or suppressed one skipped.
            ``None`` for a job that sends no email (an HTTP push): no row is checked for
            one, so its dry run and ``why`` agree with its runs.
        sender: the From of the job's emails, e.g. ``"Shop <renewals@shop.example>"``;
            ``--from`` (``BATCHRUN_FROM``) overrides it. Default: ``"{name}@localhost"``.
        retry: the ``RetryPolicy`` (attempts, backoff, max_delay_s); unset fields take
            the deployment's (``BATCHRUN_MAX_RECEIVES``, ``BATCHRUN_RETRY_BASE_S``,
            ``BATCHRUN_RETRY_MAX_BACKOFF_S``).
        status_names: ``batchrun status`` keys the job shows first, under its own names
            as well (the birthday job's ``succeeded`` is ``emails_sent`` too, as batchrun
            0.1 said).
        backends: the outside services ``process`` calls, by name: ``batchrun.Backend``
            (concurrency, rate, ready probe), reached with ``ctx.backend(name)`` or
            ``ctx.http(name)``.
    """

    name: ClassVar[str] = ""
    period: ClassVar[Unit] = "month"
    once_per: ClassVar[Unit | None] = None
    description: ClassVar[str] = ""
    sql: ClassVar[SqlFolder | None] = None
    migrations: ClassVar[SqlFolder | None] = None
    templates: ClassVar[Path | str | None] = None
    requires: ClassVar[Mapping[str, Sequence[str]]] = {}
    counters: ClassVar[Sequence[str]] = ()
    address: ClassVar[str | None] = "email"
    sender: ClassVar[str | None] = None
    retry: ClassVar[RetryPolicy] = RetryPolicy()
    status_names: ClassVar[Mapping[str, str]] = {}
    backends: ClassVar[Mapping[str, Backend]] = {}

    @classmethod
    def once_unit(cls) -> Unit:
        return cls.once_per or cls.period

    @classmethod
    def sender_address(cls) -> str:
        """The job's own From: ``sender``, else ``"{name}@localhost"``."""
        return cls.sender or f"{cls.name}@localhost"

    async def page(self, ctx: Context, after: int, limit: int) -> list[dict[str, Any]]:
        """Rows with an integer ``id`` greater than ``after``, ascending, at most ``limit``."""
        raise NotImplementedError

    async def prepare(self, ctx: Context, rows: list[dict[str, Any]]) -> None:
        """Once per claimed page, before any ``process``: batched effects (optional).

        It may add keys to the rows; ``process`` sees them.
        """

    async def process(self, ctx: Context, row: dict[str, Any]) -> None:
        """Do one entity. Returning is success; raise ``Skip``, ``Retry`` or ``Fail``."""
        raise NotImplementedError

    async def status(self, ctx: Context) -> dict[str, int]:
        """Extra counts for ``batchrun status`` (optional), e.g. the birthday job's cards."""
        return {}

    async def seed(
        self, ctx: Context, count: int, *, seed: int = 1, force: bool = False
    ) -> list[str]:
        """Demo data for ``batchrun db seed --job NAME`` (optional): add ``count`` rows its
        page returns, the same ones for the same ``seed``; refuse a table that already
        has rows unless ``force`` (raise ``ValueError`` with the one line). Returns lines
        for the person who asked (how many were added, ids to ``preview``)."""
        raise NotImplementedError(f"job {self.name!r} has no demo data (Job.seed)")

    async def explain(self, ctx: Context) -> Explained | None:
        """``batchrun db explain``'s plans and verdict (optional): ``([(label, plan
        rows), ...], one line)``. None (the default): batchrun explains each query
        ``page`` runs through ``ctx.db`` and says which index it reads."""
        return None

    async def aclose(self) -> None:
        """Release what the job opened in this event loop, e.g. an HTTP client (optional).

        The Lambda handler calls it at the end of every invocation: the next one runs in a
        new event loop, with new job instances.
        """


__all__ = [
    "NAME",
    "Busy",
    "Context",
    "ContextDb",
    "ContextEffects",
    "Fail",
    "Job",
    "Retry",
    "RetryPolicy",
    "Skip",
    "Verdict",
]

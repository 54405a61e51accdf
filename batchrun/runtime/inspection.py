"""Looking without touching: ``status`` (what the ledger and the job count) and ``preview``
(the email a job would send to one entity, rendered, nothing claimed, written or sent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchrun.control.history import History
from batchrun.db.base import Database
from batchrun.db.store import FINAL_STATES, Scope, Store
from batchrun.effects.lender import NoEffects
from batchrun.effects.sending import Sender
from batchrun.errors import UsageError
from batchrun.job import Context, Job, Skip
from batchrun.mail.message import Message
from batchrun.period import Period
from batchrun.pipeline.pager import page, recheck

if TYPE_CHECKING:
    from batchrun.pipeline.engine import StopToken
    from batchrun.pipeline.wiring import Wiring


async def status(w: Wiring, which: Job, period: Period, *, problems: int) -> dict[str, Any]:
    """The ledger's counts for the job's period, the job's own (``Job.status``), and the
    first ``problems`` entities not done."""
    counts = await w.store.status(job=which.name, period=str(period), problems=problems)
    history = History(w.store.db, lease_s=w.settings.lease_s)
    # claimed: held by a live run; the rest of the unfinished claims a stopped or dead run
    # left (the next run takes them at once, or when their lease has passed)
    stale = min(counts.claimed, await history.stale_claims(job=which.name, period=str(period)))
    ctx = Context(
        which,
        period,
        w.store.jobdb,
        NoEffects(w.store),
        dry_run=True,
        env=w.settings.environ,
    )
    own = await which.status(ctx)
    if "pending" not in own:
        own = {**own, "pending": await _pending(w.store, which, ctx)}
    return {
        "succeeded": counts.succeeded,
        "skipped": counts.skipped,
        "retrying": counts.retrying,
        "failed_permanent": counts.failed_permanent,
        "claimed": counts.claimed - stale,
        "claimed_by_stopped_run": stale,
        "bounces": counts.bounces,
        "complaints": counts.complaints,
        **own,
        "problems": counts.problems,
    }


async def _pending(store: Store, which: Job, ctx: Context, page_size: int = 500) -> int:
    """Entities the job's page returns that are not finished for the once_per period
    (never touched, claimed, or waiting for a retry): what a run would still do. A job
    whose ``status`` counts them itself (birthday, in one query) is not paged."""
    scope = Scope(which.name, str(ctx.once), str(ctx.period))
    pending = 0
    after = 0
    while True:
        rows = await page(which, ctx, after, page_size)
        if not rows:
            return pending
        ids = [int(row["id"]) for row in rows]
        claims = await store.claims_of(scope, ids)
        pending += sum(1 for i in ids if i not in claims or claims[i].state not in FINAL_STATES)
        if len(rows) < page_size:
            return pending
        after = ids[-1]


async def preview(
    w: Wiring, stop: StopToken, which: Job, period: Period, entity_id: int
) -> Message:
    """The email ``job`` would send to entity ``entity_id``: its page row, then
    ``process`` with the send captured. Nothing is claimed, written or sent."""
    captured: list[Message] = []

    class Capture(Sender):
        async def send_email(self, ctx: Context, **fields: Any) -> None:
            await self.check(fields["to"])
            captured.append(self.message(ctx, **fields))

    sender = Capture(
        None,
        w.settings,
        summary=None,
        lease=None,
        stop=stop,
        limiter=None,
        templates=w.effects.templates(which),
        store=w.store,
        sender=w.settings.sender_for(which),
    )
    ctx = Context(which, period, w.store.jobdb, sender, dry_run=True, env=w.settings.environ)
    row = await recheck(which, ctx, entity_id)
    if row is None:
        some = [str(r["id"]) for r in await page(which, ctx, 0, 3)]
        hint = f"; ids it returns: {', '.join(some)}, ..." if some else "; its page is empty"
        raise UsageError(
            f"{which.name} {period}: entity {entity_id} is not in the job's page{hint}"
        )
    try:
        entity = ctx.entity(entity_id)
        await which.process(entity, row)
        entity.check_awaited()
    except Skip as exc:
        raise UsageError(f"{which.name} would skip entity {entity_id}: {exc.reason}") from None
    if not captured:
        raise UsageError(f"{which.name} sends no email to entity {entity_id}")
    return captured[0]


class _Explaining:
    """``ctx.db`` for ``db explain``: each query the page runs is explained, not run."""

    def __init__(self, db: Database, jobdb: Any) -> None:
        self.dialect = db.dialect
        self._prefix = db.queries.statements["explain_prefix"].text
        self._jobdb = jobdb
        self.plans: list[tuple[str, list[dict[str, Any]]]] = []

    async def fetch(self, sql: str, /, **params: Any) -> list[dict[str, Any]]:
        plan = await self._jobdb.fetch(f"{self._prefix}\n{sql}", **params)
        self.plans.append((sql, plan))
        return []  # an empty page: the job's page stops there

    async def execute(self, sql: str, /, **params: Any) -> int:
        raise UsageError("the job's page writes to the database: db explain explains reads")


async def page_plans(
    w: Wiring, which: Job, period: Period, page_size: int
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The database's plan of each query ``which.page`` runs for its first page."""
    explaining = _Explaining(w.store.db, w.store.jobdb)
    ctx = Context(
        which, period, explaining, NoEffects(w.store), dry_run=True, env=w.settings.environ
    )
    await page(which, ctx, 0, page_size)
    return explaining.plans

"""Looking without touching: ``status`` (what the ledger and the job count) and ``preview``
(the email a job would send to one entity, rendered, nothing claimed, written or sent)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from batchrun.db.store import Store
from batchrun.errors import UsageError
from batchrun.job import Context, Job, Skip
from batchrun.mail.message import Message
from batchrun.period import Period
from batchrun.runtime.pager import recheck
from batchrun.runtime.sending import Sender

if TYPE_CHECKING:
    from batchrun.runtime.runtime import Runtime


class _NoEffects:
    """The effects of a context that must not act (``status``): it may read the list."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def send_email(self, ctx: Context, **fields: Any) -> None:
        raise RuntimeError("no email from here")

    async def suppressed(self, addresses: Iterable[str]) -> dict[str, str]:
        return await self.store.suppressed(addresses)

    def count(self, name: str, n: int) -> None:
        pass


async def status(rt: Runtime, which: Job, period: Period, *, problems: int) -> dict[str, Any]:
    """The ledger's counts for the job's period, the job's own (``Job.status``), and the
    first ``problems`` entities not done."""
    counts = await rt.store.status(job=which.name, period=str(period), problems=problems)
    ctx = Context(
        which,
        period,
        rt.store.jobdb,
        _NoEffects(rt.store),
        dry_run=True,
        env=rt.settings.environ,
    )
    return {
        "succeeded": counts.succeeded,
        "skipped": counts.skipped,
        "retrying": counts.retrying,
        "failed_permanent": counts.failed_permanent,
        "claimed": counts.claimed,
        "bounces": counts.bounces,
        "complaints": counts.complaints,
        **await which.status(ctx),
        "problems": counts.problems,
    }


async def preview(rt: Runtime, which: Job, period: Period, entity_id: int) -> Message:
    """The email ``job`` would send to entity ``entity_id``: its page row, then
    ``process`` with the send captured. Nothing is claimed, written or sent."""
    captured: list[Message] = []

    class Capture(Sender):
        async def send_email(self, ctx: Context, **fields: Any) -> None:
            await self.check(fields["to"])
            captured.append(self.message(ctx, **fields))

    sender = Capture(
        None,
        rt.settings,
        summary=None,
        lease=None,
        stop=rt.stop,
        limiter=None,
        templates=rt.templates(which),
        store=rt.store,
        sender=rt.settings.sender_for(which),
    )
    ctx = Context(which, period, rt.store.jobdb, sender, dry_run=True, env=rt.settings.environ)
    row = await recheck(which, ctx, entity_id)
    if row is None:
        raise UsageError(f"{which.name} {period}: entity {entity_id} is not in the job's page")
    try:
        await which.process(ctx.entity(entity_id), row)
    except Skip as exc:
        raise UsageError(f"{which.name} would skip entity {entity_id}: {exc.reason}") from None
    if not captured:
        raise UsageError(f"{which.name} sends no email to entity {entity_id}")
    return captured[0]

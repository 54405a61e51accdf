"""``batchrun dead``: list, redrive or purge the retry queue's dead letters."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, print_table, stderr
from batchrun.errors import UsageError
from batchrun.queue import dead as dead_letters
from batchrun.runtime.resources import open_backends

dead_app = typer.Typer(
    no_args_is_help=True,
    help="The retry queue's dead letters: the local queue's dead rows, or the SQS "
    "dead-letter queue its RedrivePolicy names. List them, put them back (redrive), or "
    "drop them (purge).",
)
app.add_typer(dead_app, name="dead")

Json = Annotated[bool, typer.Option("--json", metavar="", help="Print JSON on stdout.")]


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


@dead_app.command("list", epilog=examples("batchrun dead list", "batchrun dead list --json"))
def dead_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Most dead letters shown.")] = 100,
    as_json: Json = False,
) -> None:
    """List the dead letters: id, job, period, entity, why it died.

    Nothing changes (on SQS the messages are hidden for a moment while they are read). On
    SQS, "receives" is the queue's ApproximateReceiveCount, which each listing adds one to.
    """
    context: Invocation = ctx.obj

    async def go() -> int:
        async with open_backends(context.settings, queue=True) as backends:
            assert backends.queue is not None
            letters = await dead_letters.list_dead(backends.queue, limit=limit)
            where = backends.queue.url
        if as_json:
            print(json.dumps([letter.to_json() for letter in letters]))
            return 0
        if not letters:
            stderr.print(f"no dead letters in {escape(where)}", highlight=False)
            return 0
        print_table(
            ("id", "job", "period", "entity", "receives", "queued at", "reason"),
            [
                (
                    letter.id,
                    letter.job or "",
                    letter.period or "",
                    "" if letter.entity_id is None else letter.entity_id,
                    letter.receive_count,
                    _when(letter.sent_at_ms),
                    letter.reason,
                )
                for letter in letters
            ],
        )
        return 0

    run_command(ctx, go)


@dead_app.command(
    "redrive",
    epilog=examples("batchrun dead redrive --id 17 --id 18", "batchrun dead redrive --all"),
)
def dead_redrive(
    ctx: typer.Context,
    ids: Annotated[
        list[str] | None,
        typer.Option("--id", metavar="ID", help="A dead letter's id (see `dead list`); repeat."),
    ] = None,
    every: Annotated[bool, typer.Option("--all", metavar="", help="Every dead letter.")] = False,
    as_json: Json = False,
) -> None:
    """Put dead letters back on the retry queue, for `batchrun retry` or the workers.

    The entities they name get their attempts back (failed for good -> retrying), so the
    next consumer works them again. Give --id (repeatable) or --all.
    """
    context: Invocation = ctx.obj

    async def go() -> int:
        if bool(ids) == every:
            raise UsageError(
                "dead redrive: give --id ID (repeatable) or --all, not both"
                if every
                else "dead redrive: give --id ID (repeatable) or --all"
            )
        async with open_backends(context.settings, queue=True) as backends:
            assert backends.queue is not None
            moved = await dead_letters.redrive(
                backends.queue, backends.store, ids=None if every else ids
            )
        missing = sorted(set(ids or ()) - {letter.id for letter in moved})
        if as_json:
            print(
                json.dumps(
                    {"redriven": len(moved), "ids": [m.id for m in moved], "not_found": missing}
                )
            )
        elif moved or not missing:
            stderr.print(f"redrove {len(moved)} dead letters", highlight=False)
        if missing:
            stderr.print(
                f"[red]error:[/] no dead letter with id {escape(', '.join(missing))}",
                highlight=False,
            )
            return 1
        return 0

    run_command(ctx, go)


@dead_app.command("purge", epilog=examples("batchrun dead purge --yes"))
def dead_purge(
    ctx: typer.Context,
    yes: Annotated[
        bool, typer.Option("--yes", metavar="", help="Yes, drop them all (required).")
    ] = False,
    as_json: Json = False,
) -> None:
    """Drop every dead letter for good. Their entities stay failed in the ledger."""
    context: Invocation = ctx.obj

    async def go() -> int:
        if not yes:
            raise UsageError("dead purge drops every dead letter for good: add --yes")
        async with open_backends(context.settings, queue=True) as backends:
            assert backends.queue is not None
            count = await dead_letters.purge(backends.queue)
        if as_json:
            print(json.dumps({"purged": count}))
        else:
            stderr.print(f"purged {count} dead letters", highlight=False)
        return 0

    run_command(ctx, go)

"""``batchrun suppress`` (the suppression list) and ``batchrun unsubscribe TOKEN``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer

from batchrun import unsubscribe as unsubscribing
from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, print_table, stderr
from batchrun.db.store import REASONS, Reason, Suppression, address_key
from batchrun.errors import ConfigError
from batchrun.mail.base import valid_address
from batchrun.runtime.resources import open_backends

suppress_app = typer.Typer(
    no_args_is_help=True,
    help="The suppression list: addresses no job mails (unsubscribed, bounced, complained, "
    "or added by hand). Addresses compare in one form: the domain in IDNA, the whole "
    "address case-folded (Jo@Bücher.example is jo@xn--bcher-kva.example).",
)
app.add_typer(suppress_app, name="suppress")

PAGE = 1000


def _address(value: str) -> str:
    address = value.strip()
    if not valid_address(address):
        raise typer.BadParameter(f"{value!r} is not an email address", param_hint="ADDR")
    return address


def _reason(value: str) -> Reason:
    for reason in REASONS:
        if value == reason:
            return reason
    raise typer.BadParameter(f"must be one of {', '.join(REASONS)}", param_hint="--reason")


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _json(entry: Suppression) -> dict[str, str]:
    return {
        "address": entry.address,
        "reason": entry.reason,
        "source": entry.source,
        "created_at": _when(entry.created_at),
    }


@suppress_app.command(
    "add",
    epilog=examples(
        "batchrun suppress add ann@example.com",
        "batchrun suppress add ann@example.com --reason complaint --source support --json",
    ),
)
def suppress_add(
    ctx: typer.Context,
    address: Annotated[str, typer.Argument(metavar="ADDR", help="The address to stop mailing.")],
    reason: Annotated[
        str,
        typer.Option("--reason", metavar="|".join(REASONS), help="Why it is suppressed."),
    ] = "manual",
    source: Annotated[
        str, typer.Option("--source", help="Where the request came from (at most 100 chars).")
    ] = "cli",
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            metavar="",
            help='Print one JSON object: {"address", "reason", "source", "created_at", "added"}.',
        ),
    ] = False,
) -> None:
    """Stop every job mailing ADDR: a run skips it ("suppressed: REASON") before any effect."""
    context: Invocation = ctx.obj
    addr = _address(address)
    why = _reason(reason)

    async def go() -> int:
        async with open_backends(context.settings) as backends:
            store = backends.store
            added = await store.suppress(addr, reason=why, source=source)
            entry = await store.suppression(addr)
        assert entry is not None
        if as_json:
            print(json.dumps({**_json(entry), "added": added}))
        elif added:
            stderr.print(f"suppressed {entry.address} ({entry.reason})", highlight=False)
        else:
            stderr.print(
                f"{entry.address} was already suppressed ({entry.reason}, from "
                f"{entry.source or '-'}, since {_when(entry.created_at)})",
                highlight=False,
            )
        return 0

    run_command(ctx, go)


@suppress_app.command(
    "remove",
    epilog=examples(
        "batchrun suppress remove ann@example.com",
        "batchrun suppress remove ann@example.com --json",
    ),
)
def suppress_remove(
    ctx: typer.Context,
    address: Annotated[str, typer.Argument(metavar="ADDR", help="The address to mail again.")],
    as_json: Annotated[
        bool,
        typer.Option("--json", metavar="", help='Print one JSON object: {"address", "removed"}.'),
    ] = False,
) -> None:
    """Take ADDR off the suppression list: jobs mail it again from their next run."""
    context: Invocation = ctx.obj
    if not address.strip():
        raise typer.BadParameter("an empty address", param_hint="ADDR")
    addr = address_key(address.strip())

    async def go() -> int:
        async with open_backends(context.settings) as backends:
            removed = await backends.store.unsuppress(addr)
        if as_json:
            print(json.dumps({"address": addr, "removed": bool(removed)}))
        elif removed:
            stderr.print(f"removed {addr} from the suppression list", highlight=False)
        else:
            stderr.print(f"{addr} is not on the suppression list", highlight=False)
        return 0

    run_command(ctx, go)


@suppress_app.command(
    "list",
    epilog=examples(
        "batchrun suppress list",
        "batchrun suppress list --json",
    ),
)
def suppress_list(
    ctx: typer.Context,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", metavar="", help='Print one JSON object: {"suppressions": [...], "count": N}.'
        ),
    ] = False,
) -> None:
    """List the suppression list in address order: address, reason, source, since when."""
    context: Invocation = ctx.obj

    async def go() -> int:
        count = 0
        rows: list[tuple[str, str, str, str]] = []
        async with open_backends(context.settings) as backends:
            after = ""
            if as_json:  # written a page at a time: any size in bounded memory
                print('{"suppressions": [', end="")
            while True:
                entries = await backends.store.suppressions(after=after, limit=PAGE)
                for entry in entries:
                    if as_json:
                        print(("," if count else "") + json.dumps(_json(entry)), end="")
                    else:
                        rows.append(
                            (entry.address, entry.reason, entry.source, _when(entry.created_at))
                        )
                    count += 1
                if len(entries) < PAGE:
                    break
                after = entries[-1].address
        if as_json:
            print(f'], "count": {count}}}')
        elif count:
            print_table(("address", "reason", "source", "since"), rows, title="suppression list")
        else:
            stderr.print("the suppression list is empty", highlight=False)
        return 0

    run_command(ctx, go)


@app.command(
    "unsubscribe",
    epilog=examples(
        "batchrun unsubscribe TOKEN",
        "batchrun unsubscribe https://example.com/unsubscribe/TOKEN --json",
    ),
)
def unsubscribe(
    ctx: typer.Context,
    token: Annotated[
        str,
        typer.Argument(
            metavar="TOKEN", help="The token from a List-Unsubscribe URL, or the whole URL."
        ),
    ],
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", metavar="", help='Print one JSON object: {"address", "job", "added"}.'
        ),
    ] = False,
) -> None:
    """Apply an unsubscribe token: suppress its address (reason unsubscribe, source its job).

    What the one-click POST to BATCHRUN_UNSUBSCRIBE_URL/TOKEN does, for a request that
    reached you another way. Needs BATCHRUN_UNSUBSCRIBE_SECRET, the secret the email was
    signed with; a forged, altered or truncated token exits 2 and changes nothing.
    """
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        signer = unsubscribing.Signer.from_settings(settings)
        if signer is None:
            raise ConfigError(
                "set BATCHRUN_UNSUBSCRIBE_URL and BATCHRUN_UNSUBSCRIBE_SECRET (the secret the "
                "emails were signed with) to apply a token"
            )
        request = signer.verify(unsubscribing.token_of(token))
        async with open_backends(settings) as backends:
            added = await unsubscribing.apply(backends.store, request)
        if as_json:
            print(json.dumps({"address": request.address, "job": request.job, "added": added}))
            return 0
        state = "unsubscribed" if added else "already suppressed:"
        stderr.print(f"{state} {request.address} (from {request.job})", highlight=False)
        return 0

    run_command(ctx, go)

"""``batchrun preview``: the email a job would send to one entity, rendered, nothing sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, output_file, say, stderr
from batchrun.cli.jobs import period_of
from batchrun.db.store import MAX_ID
from batchrun.runtime.resources import open_backends


@app.command(
    "preview",
    epilog=examples(
        "batchrun preview birthday --period 2025-06 --id 42",
        "batchrun preview birthday --period 2025-06 --id 42 --html card.html",
        "batchrun preview birthday --period 2025-06 --id 42 --json",
    ),
)
def preview(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job's name.")],
    entity: Annotated[
        int, typer.Option("--id", min=1, max=MAX_ID, help="The entity to render for.")
    ],
    period: Annotated[
        str | None, typer.Option("--period", help="The job's period; default: now (UTC).")
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", metavar="FILE", help="Also write the HTML part here.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            metavar="",
            help='Print one JSON object: {"job", "period", "id", "from", "to", "subject", '
            '"message_id", "headers", "text", "html"}.',
        ),
    ] = False,
) -> None:
    """Print the email JOB would send to entity ID, rendered from its templates.

    Nothing is claimed, written or sent: iterate on a template's copy with it.
    """
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        which = period_of(context, job, period, "preview")
        if html is not None:
            output_file("--html", html)
        entry = context.registry.entry(job)
        async with open_backends(settings, jobs=[entry.job]) as backends:
            message = await context.runtime(backends).preview(job, which, entity)
        parsed = message.to_email(utf8=True)  # a non-ASCII local part shown as it is
        text = parsed.get_body(("plain",))
        if html is not None:
            try:
                html.write_text(message.html, encoding="utf-8")
            except OSError as exc:
                stderr.print(f"[red]error:[/] cannot write {html}: {exc.strerror}", highlight=False)
                return 1
            say(f"HTML part written to {html}")
        if as_json:
            data = {
                "job": job,
                "period": str(which),
                "id": entity,
                "from": str(parsed["From"]),
                "to": str(parsed["To"]),
                "subject": str(parsed["Subject"]),
                "message_id": str(parsed["Message-ID"]),
                "headers": {k: str(v) for k, v in parsed.items()},
                "text": text.get_content() if text is not None else "",
                "html": message.html or None,
            }
            print(json.dumps(data))
            return 0
        for header in ("From", "To", "Subject", "Message-ID", "List-Unsubscribe"):
            if header in parsed:
                print(f"{header}: {parsed[header]}")
        print()
        print(text.get_content() if text is not None else "")
        return 0

    run_command(ctx, go)

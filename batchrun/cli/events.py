"""``batchrun events``: apply SES bounce and complaint notifications from an SQS queue."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app, error_line, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.cli.output import table
from batchrun.control.runrecord import RunRecord
from batchrun.events import ses as mail_events
from batchrun.pipeline import engine
from batchrun.runtime.resources import open_backends, open_queue


@app.command(
    "events",
    epilog=examples(
        "batchrun events --queue https://sqs.eu-west-1.amazonaws.com/123456789012/batchrun-ses-events",
        "batchrun events --queue URL --max 500 --json",
    ),
)
def events(
    ctx: typer.Context,
    queue_url: Annotated[
        str,
        typer.Option(
            "--queue",
            metavar="QUEUE_URL",
            help="The SQS queue SES's event destination (an SNS topic) delivers to.",
        ),
    ],
    max_messages: Annotated[
        int, typer.Option("--max", min=1, help="Most queue messages to read.")
    ] = 10_000,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON summary.")
    ] = False,
) -> None:
    """Drain SES bounce and complaint notifications (SNS-wrapped or raw) from an SQS queue.

    A permanent bounce or a complaint puts the address on the suppression list (reason
    bounce or complaint, source the SES message id) and notes it on the entity's ledger row
    (`batchrun status` counts them); a transient bounce or any other event changes
    nothing; a message that is no SES event goes to the queue's dead-letter queue, alone:
    the rest of its batch is applied. Exit 0 when every message was applied or
    dead-lettered, 1 when the database failed on some (left on the queue for a later run).
    With BATCHRUN_EVENTS_TOPIC (an SNS topic ARN) set, only notifications from that topic
    are applied; the others are dead-lettered.
    """
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        started = time.monotonic()
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(settings) as backends:
                queue = await open_queue(settings, queue_url, backends.store, concurrency=4)
                try:
                    runtime = context.runtime(backends, stop)
                    async with RunRecord(runtime, kind="events") as record:
                        summary = await mail_events.drain(
                            queue,
                            backends.store,
                            max_messages=max_messages,
                            stop=stop,
                            topic=settings.environ.get("BATCHRUN_EVENTS_TOPIC", "").strip(),
                        )
                        summary.duration_s = time.monotonic() - started
                        code = 130 if stop.stopping else summary.exit_code
                        await record.end(code, summary.to_json(), stopped=stop.reason)
                finally:
                    await queue.close()
        finally:
            uninstall()
        if as_json:
            print(json.dumps(summary.to_json()))
        else:
            table("events", summary.to_json())
        if summary.poison:
            stderr.print(
                f"{summary.poison} messages were no SES event: moved to the dead-letter queue",
                highlight=False,
            )
        if summary.failed:
            stderr.print(
                error_line(
                    f"{summary.failed} messages could not be applied (the database failed "
                    "on them): left on the queue for a later run"
                ),
                highlight=False,
            )
        if stop.stopping:
            stderr.print(f"stopped ({stop.reason}); the rest stays on the queue", highlight=False)
        return code

    run_command(ctx, go)

"""Commands that consume the queue: ``retry`` (drain once) and ``worker`` (until SIGTERM)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from batchrun import engine
from batchrun.backends import open_backends, open_queue
from batchrun.cli.app import Context, app, rate_option, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.cli.output import ASKED, table
from batchrun.runtime import Options


@app.command(
    "worker",
    epilog=examples(
        "batchrun worker --concurrency 50 --rate 10",
        'batchrun worker --queue "$BATCHRUN_RETRY_QUEUE" --idle-exit 5',
    ),
)
def worker(
    ctx: typer.Context,
    queue_url: Annotated[
        str | None,
        typer.Option(
            "--queue",
            metavar="QUEUE_URL",
            help="The queue to consume (default: the --retry-queue). Use the same queue for "
            "both, so retries and hand-offs come back to the workers.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 20,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="Emails per second at most for this worker, or 'auto'."),
    ] = None,
    prefetch: Annotated[
        int,
        typer.Option(
            "--prefetch", min=1, max=10, help="Messages taken per receive (shards are big)."
        ),
    ] = 1,
    visibility: Annotated[
        float,
        typer.Option(
            "--visibility",
            min=1.0,
            help="Seconds a taken message stays hidden; extended while it is worked on.",
        ),
    ] = 120.0,
    idle_exit: Annotated[
        float | None,
        typer.Option("--idle-exit", min=0.0, help="Exit after the queue stays empty this long."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON summary.")
    ] = False,
) -> None:
    """Consume the queue until SIGTERM: shards, retries, submitted tasks and continuations.

    For ECS, EC2 or any host; the SQS-triggered Lambda runs the same processing. A mail
    outage does not stop it: it backs off and polls on (a mailer or queue unusable when
    it starts is exit 1, one line). SIGTERM finishes the entities in flight and hands the
    rest of a shard on.
    """
    context: Context = ctx.obj
    settings = context.settings
    pace = rate_option(rate)

    async def go() -> int:
        registry = context.registry
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(
                settings,
                mail=True,
                queue=True,
                concurrency=concurrency,
                jobs=[e.job for e in registry.values()],
            ) as backends:
                assert backends.queue is not None
                consumed = backends.queue
                if queue_url is not None and queue_url != settings.retry_queue_url:
                    consumed = await open_queue(
                        settings, queue_url, backends.store, concurrency=concurrency
                    )
                try:
                    options = Options(concurrency=concurrency, rate=pace, handoff=True)
                    result = await context.runtime(backends, stop).serve(
                        consumed,
                        options,
                        prefetch=prefetch,
                        visibility_s=visibility,
                        idle_exit_s=idle_exit,
                    )
                finally:
                    if consumed is not backends.queue:
                        await consumed.close()
        finally:
            uninstall()
        if as_json:
            print(json.dumps(result.to_json()))
        else:
            table("worker", result.to_json(), always=ASKED)
        _say_lost(result.lost_claims)
        return 0

    run_command(ctx, go)


@app.command(
    "retry",
    epilog=examples(
        "batchrun retry",
        "batchrun retry --max 1000 --json",
    ),
)
def retry(
    ctx: typer.Context,
    max_messages: Annotated[
        int, typer.Option("--max", min=1, help="Most queue messages to process.")
    ] = 10_000,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 20,
    rate: Annotated[
        str | None, typer.Option("--rate", help="Emails per second at most, or 'auto'.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON summary.")
    ] = False,
) -> None:
    """Drain the retry queue once: redo each failed entity, delete what succeeds.

    What fails again comes back later (exponential backoff); after the last attempt it is
    dead-lettered and listed by `batchrun status`. Counts are entities, not messages.
    """
    context: Context = ctx.obj
    settings = context.settings
    pace = rate_option(rate)

    async def go() -> int:
        registry = context.registry
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(
                settings,
                mail=True,
                queue=True,
                concurrency=concurrency,
                jobs=[e.job for e in registry.values()],
            ) as backends:
                result = await context.runtime(backends, stop).retry(
                    Options(concurrency=concurrency, rate=pace), max_messages=max_messages
                )
        finally:
            uninstall()
        if as_json:
            print(json.dumps(result.to_json()))
        else:
            table("retry", result.to_json(), always=ASKED)
        _say_lost(result.lost_claims)
        if stop.stopping:
            stderr.print(
                f"stopped ({stop.reason}); {result.remaining} messages left for the next retry",
                highlight=False,
            )
            return 130
        return result.exit_code

    run_command(ctx, go)


def _say_lost(lost_claims: int) -> None:
    """The line `run` prints too: claims another run took over while this one was stalled."""
    if lost_claims:
        stderr.print(
            f"{lost_claims} claims were taken over by another run while this one could not "
            "renew them; that run does them",
            highlight=False,
        )

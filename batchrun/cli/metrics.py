"""``batchrun metrics``: the Prometheus text format, on stdout or into a textfile."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, output_file, stderr
from batchrun.runtime.resources import open_backends


@app.command(
    "metrics",
    epilog=examples(
        "batchrun metrics",
        "batchrun metrics --textfile /var/lib/node_exporter/textfile/batchrun.prom   # in cron",
    ),
)
def metrics_command(
    ctx: typer.Context,
    textfile: Annotated[
        Path | None,
        typer.Option(
            "--textfile",
            metavar="PATH",
            help="Write to PATH atomically (node_exporter's textfile collector) instead of "
            "printing.",
        ),
    ] = None,
) -> None:
    """Print the ledger's entities, the queue depths and the last runs as Prometheus metrics.

    batchrun_entities{job,period,state}, batchrun_queue_depth{queue},
    batchrun_last_run_timestamp_seconds{job,outcome},
    batchrun_last_success_timestamp_seconds{job}, batchrun_run_duration_seconds{job}.
    Alert on time() - batchrun_last_success_timestamp_seconds for "the job did not run".
    """
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        from batchrun.control import metrics  # prometheus-client: only for this command

        if textfile is not None:
            output_file("--textfile", textfile)
        async with open_backends(settings, queue=True) as backends:
            runs = await metrics.last_runs(backends.store)
            snapshot = await metrics.collect(backends.store, backends.queue, last_runs=runs)
        data = metrics.render(snapshot)
        if textfile is None:
            sys.stdout.write(data.decode())
            return 0
        try:
            metrics.write_textfile(textfile, data)
        except OSError as exc:
            stderr.print(f"[red]error:[/] cannot write {textfile}: {exc.strerror}", highlight=False)
            return 1
        return 0

    run_command(ctx, go)

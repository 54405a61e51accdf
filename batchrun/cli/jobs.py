"""Commands that run jobs: ``birthday``, ``run``, ``jobs`` (``preview`` is in preview.py,
``submit`` in tasks.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Annotated

import typer
from rich.markup import escape

from batchrun.cli.app import (
    Invocation,
    app,
    error_text,
    not_a_task,
    period_option,
    rate_option,
    run_command,
)
from batchrun.cli.conventions import examples, print_table, stderr
from batchrun.cli.output import (
    ASKED,
    Bar,
    MonthTally,
    progress_bar,
    say_unrecorded,
    say_why_failed,
    table,
)
from batchrun.control.runrecord import RunRecord
from batchrun.errors import UsageError
from batchrun.period import Period
from batchrun.pipeline import engine
from batchrun.pipeline.reports import mail_down
from batchrun.runtime import Options, Runtime, Summary, new_summary
from batchrun.runtime.resources import check_urls, open_backends, open_queue
from batchrun.settings import MAX_CONCURRENCY

Concurrency = Annotated[
    int,
    typer.Option("--concurrency", min=1, max=MAX_CONCURRENCY, help="Entities worked on at once."),
]
Rate = Annotated[
    str | None,
    typer.Option(
        "--rate",
        help="Effects per second at most (emails, and the calls a job makes through "
        "ctx.paced()), or 'auto' for the provider's own limit (SES). On throttling the rate "
        "halves, then grows back (AIMD). It also caps each of the job's named backends "
        "(Job.backends: ctx.backend, ctx.http), the lower rate winning; 'auto' lets one "
        "without a rate of its own find its limit. Default: no cap.",
    ),
]
DryRun = Annotated[
    bool,
    typer.Option("--dry-run", metavar="", help="Show what would happen; write and send nothing."),
]
PageSize = Annotated[
    int, typer.Option("--page-size", min=1, max=5000, help="Entities read per page.")
]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="Stop after this many entities.")]
MaxDbLoad = Annotated[
    int | None,
    typer.Option(
        "--max-db-load",
        min=1,
        metavar="N",
        help="Pause taking new pages while the database server runs more than N statements "
        "at once (Threads_running in SHOW GLOBAL STATUS, batchrun's own included), "
        "re-checking every 0.5 s; the pause is logged and counted in db_paused_s. "
        "MySQL/MariaDB only: on SQLite it is accepted and does nothing. "
        "Default: BATCHRUN_MAX_DB_LOAD, else no pause.",
    ),
]
Json = Annotated[bool, typer.Option("--json", metavar="", help="Print one JSON summary on stdout.")]
FanOutQueue = Annotated[
    str | None,
    typer.Option(
        "--fan-out",
        metavar="QUEUE_URL",
        help="Do not work: queue the period's unfinished entities as id ranges (shards) on "
        "this queue, for `batchrun worker` processes or the SQS-triggered Lambda.",
    ),
]
ShardSize = Annotated[
    int, typer.Option("--shard-size", min=1, help="Entities per shard with --fan-out.")
]


@app.command(
    "birthday",
    epilog=examples(
        "batchrun birthday --month 2025-06 --dry-run",
        "batchrun birthday --month 2025-06 --concurrency 50 --rate 40",
        "batchrun birthday --month 2025-06 --json",
    ),
)
def birthday(
    ctx: typer.Context,
    month: Annotated[
        str | None, typer.Option("--month", help="YYYY-MM; default: the current month (UTC).")
    ] = None,
    dry_run: DryRun = False,
    concurrency: Concurrency = 20,
    rate: Rate = None,
    page_size: PageSize = 500,
    limit: Limit = None,
    as_json: Json = False,
    fan_out: FanOutQueue = None,
    shard_size: ShardSize = 1000,
    max_db_load: MaxDbLoad = None,
) -> None:
    """Give every active user born in MONTH one gift card for the year and one birthday email.

    The same as `batchrun run birthday --period MONTH`. Running the same month again does
    nothing new. Exit 0 when every user is done, 3 when some failed and wait in the retry
    queue (run `batchrun retry`), or the mail server did not answer (refused, timed out)
    and the whole month waits there, nothing done; 1 on an error, e.g. a login refused or
    an outbox not writable (one `error:` line; with --json the summary still, with an
    "error" key).
    """
    which = period_option("month", month, "--month")
    pace = rate_option(rate)
    options = Options(
        concurrency=concurrency,
        rate=pace,
        page_size=page_size,
        limit=limit,
        max_db_load=max_db_load,
    )
    _run_job(ctx, "birthday", which, options, dry_run, as_json, fan_out, shard_size)


@app.command(
    "run",
    epilog=examples(
        "batchrun run birthday --period 2025-06",
        "batchrun --jobs ./greetings.py run greeting --period 2025-06-01 --dry-run",
        "batchrun run renewal --period 2025-06-01 --limit 100 --json",
    ),
)
def run(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job's name (see `batchrun jobs`).")],
    period: Annotated[
        str | None,
        typer.Option(
            "--period", help="2025, 2025-06 or 2025-06-01, by the job's period; default: now (UTC)."
        ),
    ] = None,
    dry_run: DryRun = False,
    concurrency: Concurrency = 20,
    rate: Rate = None,
    page_size: PageSize = 500,
    limit: Limit = None,
    as_json: Json = False,
    fan_out: FanOutQueue = None,
    shard_size: ShardSize = 1000,
    max_db_load: MaxDbLoad = None,
) -> None:
    """Run JOB for one period: every entity its page returns, exactly once per its once_per.

    Exit 0 when every entity is done, 3 when some failed and wait in the retry queue, or
    the mail server did not answer (refused, timed out) and the whole period waits there,
    nothing done (`batchrun retry` does it); 1 on an error, e.g. a login refused (one
    `error:` line; with --json the summary still, with an "error" key).
    """
    pace = rate_option(rate)
    options = Options(
        concurrency=concurrency,
        rate=pace,
        page_size=page_size,
        limit=limit,
        max_db_load=max_db_load,
    )
    _run_job(ctx, job, period, options, dry_run, as_json, fan_out, shard_size)


def period_of(
    context: Invocation, name: str, period: Period | str | None, command: str = "run"
) -> Period:
    """The period ``command`` (a run, a preview) works on: exit 2 for a task job."""
    job = context.registry.get_job(name)
    not_a_task(job, command)
    if isinstance(period, Period):
        return period
    return period_option(job.period, period, "--period")


def _run_job(
    ctx: typer.Context,
    name: str,
    period: Period | str | None,
    options: Options,
    dry_run: bool,
    as_json: bool,
    fan_out: str | None,
    shard_size: int,
) -> None:
    context: Invocation = ctx.obj
    settings = context.settings

    async def go() -> int:
        began = time.monotonic()
        entry = context.registry.entry(name)
        which = period_of(context, name, period)
        if fan_out is not None and dry_run:
            # Fanning out queues shards that workers then run for real.
            raise UsageError(
                "--dry-run queues nothing: leave out --fan-out (the dry run counts the whole "
                "period its shards would cover)"
            )
        if fan_out is not None:
            return await _fan_out(context, name, which, fan_out, shard_size, as_json)
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        started: list[Summary] = []
        options.on_start = started.append
        try:
            if dry_run:
                # Nothing is opened, but a dry run checks the setup the real run would get.
                check_urls(settings, mail=True, queue=True)
            async with open_backends(
                settings,
                mail=not dry_run,
                queue=not dry_run,
                concurrency=options.concurrency,
                jobs=[entry.job],
            ) as backends:
                runtime = context.runtime(backends, stop)
                month: MonthTally | None = None
                # a dry run writes nothing, not even its history row
                record = (
                    None if dry_run else RunRecord(runtime, kind="run", job=name, period=str(which))
                )
                with progress_bar(as_json, f"{name} {which}") as bar:
                    async with record or contextlib.nullcontext():
                        if not as_json:
                            month = MonthTally.of(await runtime.status(name, which, problems=0))
                        if month is not None:
                            bar.set_total(month.bar_total(options.limit), month.done_before)
                        options.on_progress = bar.advance
                        if record is not None:
                            show_paused(runtime, bar, name, str(which))
                            options.on_progress = record.progress(bar.advance)
                        summary = await runtime.run(which, options, job=name, dry_run=dry_run)
                        code = _exit_code(summary, stop)
                        if record is not None:
                            await record.end(code, summary.to_json(), stopped=summary.stopped)
        except Exception as exc:
            if started:
                say_unrecorded(started[0])
            if as_json:  # what the run reached, and why it ended (the line follows)
                if started:
                    reached = started[0]
                else:  # it ended before it started: the whole shape, every count at 0
                    reached = new_summary(entry.job, which, dry_run)
                    reached.duration_s = time.monotonic() - began
                print(json.dumps({**reached.to_json(), "error": error_text(context, exc)}))
            raise
        finally:
            uninstall()
        data = summary.to_json()
        # The mail backend did not answer at the start: the whole period waits in the queue.
        unstarted = handed_on_unstarted(summary)
        if as_json:
            print(json.dumps(data))
        else:
            title = f"{name} {which}" + (" (dry run)" if dry_run else "")
            # --max-db-load asks about the pauses: their row shows even at 0.
            paced = {"db_paused_s"} if options.max_db_load is not None else set()
            table(title, data, always=ASKED | set(summary.counters) | paced)
            # A bug stopped it: "the same command goes on" would not be true; its line says.
            # Nor when it handed the whole period on: `batchrun retry` goes on.
            cut_short = (
                summary.error is None
                and not unstarted
                and (summary.stopped is not None or options.limit is not None)
            )
            if month is not None and cut_short and not dry_run and month.left(bar.worked):
                stderr.print(month.say(bar.worked), highlight=False, soft_wrap=True)
            if not unstarted and summary.error is None:  # an error's line says why
                say_why_failed(summary, f"batchrun status {name} --period {which}")
            if summary.exit_code == 3 and not unstarted:
                stderr.print("some entities wait in the retry queue: run `batchrun retry` later")
        if unstarted:
            stderr.print(escape(summary.stopped or ""), highlight=False, soft_wrap=True)
            stderr.print(
                f"nothing done: {name} {which} waits in the retry queue; `batchrun retry` "
                "does it once the mail backend answers",
                highlight=False,
                soft_wrap=True,
            )
        say_unrecorded(summary)
        if summary.error is not None:
            stderr.print(f"[red]error:[/] {escape(summary.error)}", highlight=False, soft_wrap=True)
            return 1
        if summary.lost_claims:
            stderr.print(
                f"{summary.lost_claims} claims were taken over by another run while this one "
                "could not renew them; that run does them",
                highlight=False,
            )
        if summary.paused:
            done = "a run now would do nothing" if dry_run else "nothing done"
            stderr.print(
                f"{name} {which} is paused: {done} (`batchrun resume {name}`)", highlight=False
            )
        if code == 130:
            stderr.print(
                f"stopped ({summary.stopped}); {summary.left_pending} claimed entities not "
                "started are left pending for the next run",
                highlight=False,
            )
        return code

    run_command(ctx, go)


def _exit_code(summary: Summary, stop: engine.StopToken) -> int:
    """130 for a stop (a signal, `batchrun cancel`), else the summary's own code."""
    if stop.stopping and summary.stopped and not mail_down(summary.stopped):
        return 130
    return summary.exit_code


def handed_on_unstarted(summary: Summary) -> bool:
    """Whether the run claimed nothing and handed its whole range on because the mail
    backend did not answer when it began (``Runtime.run``)."""
    return summary.continuation and summary.eligible == 0 and mail_down(summary.stopped)


def show_paused(runtime: Runtime, bar: Bar, job: str, period: str) -> None:
    """Show ``paused`` in the progress bar while `batchrun pause` holds the run."""

    def changed() -> None:
        held = runtime.steering.paused(job, period)
        bar.describe(f"{job} {period}" + (" [yellow](paused)[/]" if held else ""))

    runtime.steering.on_change = changed


async def _fan_out(
    context: Invocation, name: str, which: Period, queue_url: str, shard_size: int, as_json: bool
) -> int:
    settings = context.settings
    entry = context.registry.entry(name)
    async with open_backends(settings, jobs=[entry.job]) as backends:
        queue = await open_queue(settings, queue_url, backends.store, concurrency=4)
        try:
            result = await context.runtime(backends).fan_out(
                which, queue, shard_size=shard_size, job=name
            )
        finally:
            await queue.close()
    if as_json:
        print(json.dumps(result.to_json()))
    else:
        table(f"{name} {which} fan-out to {queue.url}", result.to_json(), always=ASKED)
    return 0


@app.command(
    "jobs",
    epilog=examples(
        "batchrun jobs",
        "batchrun --jobs ./greetings.py jobs --json",
    ),
)
def jobs(ctx: typer.Context, as_json: Json = False) -> None:
    """List the jobs batchrun knows: built-in, --jobs and the batchrun.jobs entry points."""
    context: Invocation = ctx.obj

    async def go() -> int:
        described = context.registry.describe()
        if as_json:
            print(json.dumps(described))
            return 0
        print_table(
            ("job", "period", "once per", "description", "source"),
            [
                (
                    j["name"],
                    *((j["period"], j["once_per"]) if j["kind"] == "period" else ("tasks", "-")),
                    j["description"],
                    j["source"],
                )
                for j in described
            ],
        )
        return 0

    run_command(ctx, go)

"""The command line: thin typer commands that parse, delegate and exit with the contract's code.

This is the only place that catches BatchrunError: one clear line on stderr, no traceback
unless -v. Exit codes: 0 done, 3 some users queued for retry, 1 fatal, 2 usage,
130 stopped by a signal (the rest left pending for the next run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from batchrun import engine
from batchrun.backends import open_backends, open_queue
from batchrun.errors import BatchrunError, ConfigError
from batchrun.jobs.birthday import BirthdayJob, Options
from batchrun.jobs.month import Month, parse_month
from batchrun.settings import Settings, parse_rate
from batchrun.urls import mask_text

try:  # typer 0.2x vendors click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

T = TypeVar("T")
log = logging.getLogger("batchrun")

app = typer.Typer(
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    help="Run per-user batch jobs against your own database: exactly once, resumable, fast.",
)
db_app = typer.Typer(
    no_args_is_help=True, help="Create the schema, add demo users, show the page query's plan."
)
app.add_typer(db_app, name="db")

stdout = Console()
stderr = Console(stderr=True)


@dataclass
class Context:
    settings: Settings
    verbose: int


@app.callback()
def main_options(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="BATCHRUN_DB",
            show_default="sqlite:///batchrun.db",
            help="mysql://user:pass@host:port/db or sqlite:///path",
        ),
    ] = None,
    mail: Annotated[
        str | None,
        typer.Option(
            "--mail",
            envvar="BATCHRUN_MAIL",
            show_default="file://outbox",
            help="smtp://host:port (smtps://, ?starttls=1), file://DIR, console://, discard://",
        ),
    ] = None,
    retry_queue: Annotated[
        str | None,
        typer.Option(
            "--retry-queue",
            envvar="BATCHRUN_RETRY_QUEUE",
            show_default="a queue table in the --db database",
            help="Where failed users wait for `batchrun retry`.",
        ),
    ] = None,
    sender: Annotated[
        str | None,
        typer.Option(
            "--from",
            envvar="BATCHRUN_FROM",
            show_default="birthday@localhost",
            help="Sender address.",
        ),
    ] = None,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="More logging; tracebacks.")
    ] = 0,
) -> None:
    """batchrun: the monthly birthday gift card, and more per-user jobs to come."""
    try:
        settings = Settings.from_env().with_overrides(
            db_url=db, mail_url=mail, retry_queue_url=retry_queue, sender=sender
        )
    except BatchrunError as exc:
        stderr.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    ctx.obj = Context(settings, verbose)
    _setup_logging(verbose)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    root = logging.getLogger()
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        root.addHandler(RichHandler(console=stderr, show_path=False, markup=False))
    root.setLevel(level)
    # botocore's DEBUG records carry signed request headers (keys, session tokens): the
    # AWS libraries never log below INFO, whatever -v asks for.
    for name in ("botocore", "aiobotocore", "boto3", "urllib3"):
        logging.getLogger(name).setLevel(max(level, logging.INFO))


def _month(value: str | None) -> Month:
    if value is None:
        return Month.current()
    try:
        return parse_month(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--month") from None


def _rate(value: str | None) -> float | Literal["auto"] | None:
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rate") from None


def _run(ctx: typer.Context, make: Callable[[], Coroutine[Any, Any, int]]) -> None:
    """Run a command's coroutine; turn a BatchrunError into one line and its exit code."""
    context: Context = ctx.obj
    try:
        code = asyncio.run(make())
    except BatchrunError as exc:
        if context.verbose:
            stderr.print_exception()
        settings = context.settings
        text = mask_text(str(exc), settings.db_url, settings.mail_url, settings.retry_queue_url)
        stderr.print(f"[red]error:[/] {text}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        stderr.print("[red]aborted[/]")
        raise typer.Exit(130) from None
    raise typer.Exit(code)


# -- db ------------------------------------------------------------------------------------


@db_app.command("migrate")
def db_migrate(ctx: typer.Context) -> None:
    """Create or upgrade the schema; idempotent, and never drops application data."""
    settings: Settings = ctx.obj.settings

    async def go() -> int:
        async with open_backends(settings, create=True, migrated=False) as backends:
            store = backends.store
            applied = await store.migrate()
        if applied:
            stderr.print(f"migrated {store.db.url}: {', '.join(applied)}", highlight=False)
        else:
            stderr.print(f"{store.db.url} is up to date", highlight=False)
        return 0

    _run(ctx, go)


@db_app.command("seed")
def db_seed(
    ctx: typer.Context,
    users: Annotated[int, typer.Option("--users", min=1, help="How many demo users to add.")],
    seed: Annotated[int, typer.Option("--seed", help="Random seed: same seed, same users.")] = 1,
    force: Annotated[
        bool, typer.Option("--force", help="Add users even if the user table is not empty.")
    ] = False,
) -> None:
    """Add deterministic demo users (a few inactive, without or with invalid addresses)."""
    settings: Settings = ctx.obj.settings

    async def go() -> int:
        async with open_backends(settings) as backends:
            store = backends.store
            count = await store.seed_users(users, seed=seed, force=force)
        stderr.print(f"added {count} users to {store.db.url}", highlight=False)
        return 0

    _run(ctx, go)


@db_app.command("explain")
def db_explain(
    ctx: typer.Context,
    month: Annotated[str | None, typer.Option("--month", help="YYYY-MM")] = None,
) -> None:
    """Show the page query's plan, to check it uses idx_user_birth_month_status_id."""
    settings: Settings = ctx.obj.settings
    which = _month(month)

    async def go() -> int:
        async with open_backends(settings) as backends:
            rows = await backends.store.explain(year=which.year, month=which.month)
        for row in rows:
            stdout.print(" | ".join("" if v is None else str(v) for v in row), highlight=False)
        return 0

    _run(ctx, go)


# -- birthday ------------------------------------------------------------------------------


@app.command("birthday")
def birthday(
    ctx: typer.Context,
    month: Annotated[
        str | None, typer.Option("--month", help="YYYY-MM; default: the current month (UTC).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would happen; write and send nothing.")
    ] = False,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Users worked on at once.")
    ] = 20,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Emails per second at most, or 'auto' for the provider's own limit (SES). "
            "On throttling the rate halves, then grows back (AIMD). Default: no cap.",
        ),
    ] = None,
    page_size: Annotated[
        int, typer.Option("--page-size", min=1, max=5000, help="Users read per page.")
    ] = 500,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Stop after this many users.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON summary on stdout.")
    ] = False,
    fan_out: Annotated[
        str | None,
        typer.Option(
            "--fan-out",
            metavar="QUEUE_URL",
            help="Do not send: queue the month's unfinished users as id ranges (shards) on "
            "this queue, for `batchrun worker` processes or the SQS-triggered Lambda.",
        ),
    ] = None,
    shard_size: Annotated[
        int, typer.Option("--shard-size", min=1, help="Users per shard with --fan-out.")
    ] = 1000,
) -> None:
    """Give every active user born in MONTH one gift card for the year and one birthday email.

    Running the same month again does nothing new. Exit 0 when every user is done, 3 when
    some failed and wait in the retry queue (run `batchrun retry`).
    """
    settings: Settings = ctx.obj.settings
    which = _month(month)
    pace = _rate(rate)
    if fan_out is not None:
        return _run(ctx, lambda: _fan_out(settings, which, fan_out, shard_size, as_json))

    async def go() -> int:
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(
                settings, mail=not dry_run, queue=not dry_run, concurrency=concurrency
            ) as backends:
                store = backends.store
                job = BirthdayJob(store, backends.mailer, backends.queue, settings, stop=stop)
                options = Options(
                    concurrency=concurrency, rate=pace, page_size=page_size, limit=limit
                )
                with _progress(as_json, f"birthday {which}") as bar:
                    if bar is not None:
                        counts = await store.status(year=which.year, month=which.month, problems=0)
                        total = counts.pending if limit is None else min(limit, counts.pending)
                        bar.set_total(total)
                        options.on_progress = bar.advance
                    summary = await job.run(which, options, dry_run=dry_run)
        finally:
            uninstall()
        if as_json:
            print(json.dumps(summary.to_json()))
        else:
            _table(f"birthday {which}" + (" (dry run)" if dry_run else ""), summary.to_json())
            if summary.exit_code == 3:
                stderr.print("some users wait in the retry queue: run `batchrun retry` later")
        if stop.stopping and summary.stopped and not summary.stopped.startswith("mail"):
            stderr.print(
                f"stopped ({summary.stopped}); {summary.left_pending} users left "
                "pending for the next run",
                highlight=False,
            )
            return 130
        return summary.exit_code

    _run(ctx, go)


async def _fan_out(
    settings: Settings, which: Month, queue_url: str, shard_size: int, as_json: bool
) -> int:
    async with open_backends(settings) as backends:
        queue = await open_queue(settings, queue_url, backends.store, concurrency=4)
        try:
            job = BirthdayJob(backends.store, None, None, settings)
            result = await job.fan_out(which, queue, shard_size=shard_size)
        finally:
            await queue.close()
    if as_json:
        print(json.dumps(result.to_json()))
    else:
        _table(f"birthday {which} fan-out to {queue.url}", result.to_json())
    return 0


# -- worker --------------------------------------------------------------------------------


@app.command("worker")
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
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON summary.")] = False,
) -> None:
    """Consume the queue until SIGTERM: fan-out shards, retries and continuations.

    For ECS, EC2 or any host; the SQS-triggered Lambda runs the same processing. SIGTERM
    finishes the users in flight and hands the rest of the shard on.
    """
    settings: Settings = ctx.obj.settings
    pace = _rate(rate)

    async def go() -> int:
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(
                settings, mail=True, queue=True, concurrency=concurrency
            ) as backends:
                assert backends.queue is not None
                consumed = backends.queue
                if queue_url is not None and queue_url != settings.retry_queue_url:
                    consumed = await open_queue(
                        settings, queue_url, backends.store, concurrency=concurrency
                    )
                try:
                    job = BirthdayJob(
                        backends.store, backends.mailer, backends.queue, settings, stop=stop
                    )
                    options = Options(concurrency=concurrency, rate=pace, handoff=True)
                    result = await job.serve(
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
            _table("worker", result.to_json())
        return 0

    _run(ctx, go)


# -- retry ---------------------------------------------------------------------------------


@app.command("retry")
def retry(
    ctx: typer.Context,
    max_messages: Annotated[
        int, typer.Option("--max", min=1, help="Most queue messages to process.")
    ] = 10_000,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1)] = 20,
    rate: Annotated[
        str | None, typer.Option("--rate", help="Emails per second at most, or 'auto'.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON summary.")] = False,
) -> None:
    """Drain the retry queue once: redo each failed user, delete what succeeds.

    What fails again comes back later (exponential backoff); after the last attempt it is
    dead-lettered and listed by `batchrun status`.
    """
    settings: Settings = ctx.obj.settings
    pace = _rate(rate)

    async def go() -> int:
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(
                settings, mail=True, queue=True, concurrency=concurrency
            ) as backends:
                job = BirthdayJob(
                    backends.store, backends.mailer, backends.queue, settings, stop=stop
                )
                result = await job.retry(
                    Options(concurrency=concurrency, rate=pace), max_messages=max_messages
                )
        finally:
            uninstall()
        if as_json:
            print(json.dumps(result.to_json()))
        else:
            _table("retry", result.to_json())
        return result.exit_code

    _run(ctx, go)


# -- status --------------------------------------------------------------------------------


@app.command("status")
def status(
    ctx: typer.Context,
    month: Annotated[str | None, typer.Option("--month", help="YYYY-MM; default: now.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Cards, emails sent, pending, skipped and failed users, queue and dead-letter depths."""
    settings: Settings = ctx.obj.settings
    which = _month(month)

    async def go() -> int:
        async with open_backends(settings, queue=True) as backends:
            assert backends.queue is not None
            counts = await backends.store.status(year=which.year, month=which.month)
            depth, dead = await backends.queue.depths()
        data: dict[str, Any] = {
            "month": str(which),
            "cards": counts.cards,
            "emails_sent": counts.emails_sent,
            "pending": counts.pending,
            "skipped": counts.skipped,
            "retrying": counts.retrying,
            "failed_permanent": counts.failed_permanent,
            "retry_queue_depth": depth,
            "dead_letter_depth": dead,
            "problems": [
                {
                    "user_id": uid,
                    "state": _STATE_NAMES.get(state, str(state)),
                    "attempts": attempts,
                    "reason": reason,
                }
                for uid, state, attempts, reason in counts.problems
            ],
        }
        if as_json:
            print(json.dumps(data))
            return 0
        _table(f"status {which}", {k: v for k, v in data.items() if k != "problems"})
        if counts.problems:
            table = Table("user", "state", "attempts", "reason", title="users not sent")
            for p in data["problems"]:
                table.add_row(str(p["user_id"]), p["state"], str(p["attempts"]), p["reason"] or "")
            stdout.print(table)
        return 0

    _run(ctx, go)


_STATE_NAMES = {0: "pending", 1: "sent", 2: "skipped", 3: "retrying", 4: "failed"}


# -- output --------------------------------------------------------------------------------


class _RateColumn(ProgressColumn):
    """Users per second."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:,.0f} users/s", style="cyan")


class _Bar:
    def __init__(self, progress: Progress, task_id: Any) -> None:
        self._progress = progress
        self._task = task_id

    def set_total(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def advance(self, event: engine.Progress) -> None:
        if event.kind != "total":
            self._progress.advance(self._task, event.count)


@contextlib.contextmanager
def _progress(quiet: bool, title: str) -> Any:
    """A progress bar on stderr when it is a terminal; None otherwise."""
    if quiet or not stderr.is_terminal:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        _RateColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    )
    with progress:
        yield _Bar(progress, progress.add_task(title, total=None))


def _table(title: str, data: dict[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    for key, value in data.items():
        if key in ("job", "month", "dry_run") or value is None:
            continue
        table.add_row(key.replace("_", " "), str(value))
    stdout.print(table)


def main() -> None:
    """Console-script entry point: usage errors as one line, exit 2."""
    try:
        code = app(prog_name="batchrun", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:
        exc.show()  # the help screen, as typer shows it
        sys.exit(exc.exit_code)
    except click_exceptions.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "batchrun"
        print(f"error: {exc.format_message()} (see `{where} --help`)", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()

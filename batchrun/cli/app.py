"""The typer app, its global options, and what every command shares: settings, the jobs,
the runtime, and turning a BatchrunError into one line and its exit code.

This is the only place that catches BatchrunError: one clear line on stderr, no traceback
unless -v. Exit codes: 0 done, 3 some entities queued for retry, 1 fatal, 2 usage,
130 stopped by a signal (the rest left pending for the next run).
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.logging import RichHandler
from rich.text import Text

try:  # typer 0.2x vendors click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from batchrun import __version__
from batchrun.cli.conventions import reader_gone, stderr, stdout_gone
from batchrun.errors import BatchrunError, ConfigError, UsageError
from batchrun.job import Job
from batchrun.period import Period, Unit, current, parse
from batchrun.pipeline.engine import StopToken
from batchrun.registry import Registry, builtin_modules, discover, parse_specs
from batchrun.runtime import Runtime, event_loop
from batchrun.runtime.resources import Backends
from batchrun.settings import Settings, parse_rate
from batchrun.task import is_task
from batchrun.urls import mask_text, shown

log = logging.getLogger("batchrun")

app = typer.Typer(
    rich_markup_mode="rich",
    # A traceback (-v, or a bug) never shows local variables: they hold URLs with passwords.
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    help="Run per-entity batch jobs against your own database: exactly once, resumable, fast.",
)
db_app = typer.Typer(
    no_args_is_help=True, help="Create the schema, add demo users, show the page query's plan."
)
app.add_typer(db_app, name="db")


def error_line(text: str) -> Text:
    """``error: TEXT`` with the word in red and TEXT as it is."""
    return Text.assemble(("error:", "red"), " ", text)


@dataclass
class Invocation:
    """What every command of one ``batchrun`` invocation shares: its settings and -v."""

    settings: Settings
    verbose: int
    _registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        """The jobs: built-in, ``--jobs`` and the ``batchrun.jobs`` entry points (loaded once)."""
        if self._registry is None:
            self._registry = discover(
                parse_specs(self.settings.jobs),
                builtins=builtin_modules(self.settings.builtin_jobs),
            )
        return self._registry

    def runtime(self, backends: Backends, stop: StopToken | None = None) -> Runtime:
        registry = self.registry
        return Runtime(
            {name: entry.job for name, entry in registry.items()},
            backends.store,
            backends.mailer,
            backends.queue,
            self.settings,
            stop=stop,
            templates_dirs={name: entry.templates_dir for name, entry in registry.items()},
        )


def _print_version(value: bool) -> None:
    if value:
        print(f"batchrun {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="BATCHRUN_DB",
            show_default="sqlite:///batchrun.db",
            help="mysql://user:pass@host:port/db, postgresql://user:pass@host:port/db "
            "or sqlite:///path; on a server ?reply_timeout=S (default 60, 0 never) drops a "
            "connection whose statement is not answered in full that long",
        ),
    ] = None,
    mail: Annotated[
        str | None,
        typer.Option(
            "--mail",
            envvar="BATCHRUN_MAIL",
            show_default="file://outbox",
            help="smtp://host:port (smtps://, ?starttls=1), ses://REGION, file://DIR, "
            "console://, discard://",
        ),
    ] = None,
    retry_queue: Annotated[
        str | None,
        typer.Option(
            "--retry-queue",
            envvar="BATCHRUN_RETRY_QUEUE",
            show_default="a queue table in the --db database",
            help="Where failed entities wait for `batchrun retry` (an SQS queue URL).",
        ),
    ] = None,
    sender: Annotated[
        str | None,
        typer.Option(
            "--from",
            envvar="BATCHRUN_FROM",
            show_default="each job's own (Job.sender), else JOB@localhost",
            help="Sender address of every job's emails; its domain ends every Message-ID.",
        ),
    ] = None,
    jobs: Annotated[
        str | None,
        typer.Option(
            "--jobs",
            envvar="BATCHRUN_JOBS",
            metavar="SPEC[,SPEC…]",
            show_default="the built-in jobs",
            help="Modules or .py files defining jobs (subclasses of batchrun.Job).",
        ),
    ] = None,
    templates: Annotated[
        str | None,
        typer.Option(
            "--templates",
            envvar="BATCHRUN_TEMPLATES",
            metavar="DIR",
            show_default="each job's own",
            help="Email templates (JOB/subject.txt, body.txt, body.html) that override the jobs'.",
        ),
    ] = None,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            metavar="",
            help="-v: batchrun's progress and tracebacks; -vv: its debug; -vvv: the drivers' too.",
        ),
    ] = 0,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            metavar="",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """batchrun: per-entity batch jobs on your own database (the birthday gift card first)."""
    try:
        settings = Settings.from_env().with_overrides(
            db_url=db,
            mail_url=mail,
            retry_queue_url=retry_queue,
            sender=sender,
            jobs=jobs,
            templates_dir=templates,
        )
    except BatchrunError as exc:
        stderr.print(error_line(str(exc)), highlight=False)
        raise typer.Exit(exc.exit_code) from None
    ctx.obj = Invocation(settings, verbose)
    _setup_logging(verbose)


_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(message)s"


class _PlainHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """One line per record on whatever ``sys.stderr`` is now: for cron logs, pipes and
    ``grep``, where rich would wrap a record at 80 columns."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(_PLAIN_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    root = logging.getLogger()
    if not any(isinstance(h, RichHandler | _PlainHandler) for h in root.handlers):
        root.addHandler(
            RichHandler(console=stderr, show_path=False, markup=False)
            if stderr.is_terminal
            else _PlainHandler()
        )
    for handler in root.handlers:
        if isinstance(handler, RichHandler | _PlainHandler):
            # Without -v a record's exception is its one line; -v shows the frames.
            handler.setFormatter(
                (_OneLine if verbose == 0 else logging.Formatter)(
                    "%(message)s" if isinstance(handler, RichHandler) else _PLAIN_FORMAT
                )
            )
    # -vv is batchrun's own debug; the drivers' (aiosqlite logs every statement) only at -vvv.
    root.setLevel(min(level, logging.INFO) if verbose < 3 else level)
    logging.getLogger("batchrun").setLevel(level)
    for name in ("aiosqlite", "aiomysql", "asyncio", "aiosmtplib", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose >= 3 else logging.INFO)
    if verbose == 0:  # httpx logs each request at INFO: ctx.http's, one line a call
        logging.getLogger("httpx").setLevel(logging.WARNING)
    _show_urls_safely(logging.getLogger("httpx"))
    # botocore's DEBUG records carry signed request headers (keys, session tokens): the
    # AWS libraries never log below INFO, whatever -v asks for.
    for name in ("botocore", "aiobotocore", "boto3", "urllib3"):
        logging.getLogger(name).setLevel(max(level, logging.INFO))


class _OneLine(logging.Formatter):
    """A record with its exception's one line after the message, not its traceback (a
    driver's pool warning, a second worker's failure). The record itself is left as it
    is, for any other handler."""

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return super().format(record)
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            text = super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
        said = " ".join(str(exc).split())  # one line, whatever the exception's text
        return f"{text}: {type(exc).__name__}: {said}" if said else f"{text}: {type(exc).__name__}"


class _ShownUrls(logging.Filter):
    """httpx's request lines with each URL as ``urls.shown`` gives it: the backend's URL
    may hold a password, and its path or query a key."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(shown(str(a)) if "://" in str(a)[:16] else a for a in record.args)
        return True


def _show_urls_safely(logger: logging.Logger) -> None:
    if not any(isinstance(f, _ShownUrls) for f in logger.filters):
        logger.addFilter(_ShownUrls())


def period_option(unit: Unit, value: str | None, hint: str) -> Period:
    """The period ``value`` names (default: the current one, UTC); exit 2 when malformed."""
    if value is None:
        return current(unit)
    try:
        return parse(unit, value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def not_a_task(job: Job, command: str) -> None:
    """Exit 2 when ``command`` (a period's run or preview) is given a task job: it would
    find no entity in its empty page and say so as if that were the answer."""
    if is_task(job):
        raise UsageError(
            f"{job.name} is a task job: `{command}` does not run it; submit its tasks "
            f"(`batchrun submit {job.name} --id ID`) and run `batchrun worker` or `batchrun retry`"
        )


def no_task_period(job: Job, value: str | None, hint: str = "--period") -> None:
    """Exit 2 when ``value`` gives a task job a period: it has none, and the command would
    otherwise ignore it (or steer nothing)."""
    if value is not None and is_task(job):
        raise typer.BadParameter(
            f"{job.name} is a task job, which has no periods: leave out {hint}", param_hint=hint
        )


def rate_option(value: str | None) -> float | Literal["auto"] | None:
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rate") from None


def error_text(context: Invocation, exc: BaseException) -> str:
    """The one line an error is told in: its message, every URL's password masked; an
    error batchrun did not expect is named by its type too."""
    settings = context.settings
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, BatchrunError):
        text = f"{type(exc).__name__}: {text}"
    return mask_text(text, settings.db_url, settings.mail_url, settings.retry_queue_url)


def run_command(ctx: typer.Context, make: Callable[[], Coroutine[Any, Any, int]]) -> None:
    """Run a command's coroutine; turn an error into one line and its exit code (1 for an
    error batchrun did not expect), the traceback only with -v."""
    context: Invocation = ctx.obj
    try:
        code = event_loop.run(make(), context.settings.event_loop)
        sys.stdout.flush()  # here, so a reader gone before the last line is seen below
    except KeyboardInterrupt:
        stderr.print(Text("aborted", style="red"))
        raise typer.Exit(130) from None
    except BrokenPipeError as exc:
        if stdout_gone():
            reader_gone()
        _fail(context, exc)
    except Exception as exc:
        if isinstance(exc, click_exceptions.ClickException | typer.Exit | typer.Abort):
            raise  # usage errors inside a command: click's own line and exit 2
        _fail(context, exc)
    raise typer.Exit(code)


def _fail(context: Invocation, exc: Exception) -> NoReturn:
    """The error's one line (its frames first, with -v) and its exit code."""
    if context.verbose:
        # The frames only: the message is the one line below, printed once.
        frames = "".join(traceback.format_tb(exc.__traceback__))
        stderr.print(f"Traceback (most recent call last):\n{frames}", markup=False, end="")
    line = Text.assemble(("error:", "red"), " ", error_text(context, exc))
    stderr.print(line, highlight=False, soft_wrap=True)
    raise typer.Exit(exc.exit_code if isinstance(exc, BatchrunError) else 1) from None

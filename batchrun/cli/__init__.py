"""The command line: thin typer commands that parse, delegate and exit with the contract's code.

app.py     the app, global options, settings, jobs, the runtime, errors -> exit codes
jobs.py    birthday, run, jobs, submit, preview
queue.py   retry, worker
dead.py    dead list / redrive / purge
status.py  status
runs.py    runs, and status with no job (the overview)
prune.py   prune (old run history and ended tasks)
steer.py   pause, resume, cancel
why.py     why (one entity's story)
metrics.py metrics (Prometheus text)
ui.py      ui (the dashboard, batchrun[ui])
suppress.py  suppress add / remove / list, unsubscribe
db.py      db migrate, db seed, db explain
new.py     new (a job, its templates and its test)
output.py  the progress bar, the run summary and the lines under it
conventions.py  what every command shares: metavars, Examples:, plain tables when piped
"""

from __future__ import annotations

import sys

import typer

from batchrun.cli import (
    conventions,
    db,
    dead,
    events,
    jobs,
    metrics,
    new,
    preview,
    prune,
    queue,
    runs,
    status,
    steer,
    suppress,
    tasks,
    ui,
    why,
)
from batchrun.cli.app import app

try:  # typer 0.2x vendors click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

__all__ = [
    "app",
    "db",
    "dead",
    "events",
    "jobs",
    "main",
    "metrics",
    "new",
    "preview",
    "prune",
    "queue",
    "runs",
    "status",
    "steer",
    "suppress",
    "tasks",
    "ui",
    "why",
]

conventions.apply(app)  # every command is registered by now: metavars, defaults, reflow


# The global options that take a value, and the flags; `batchrun birthday --db URL` is
# `batchrun --db URL birthday`.
GLOBAL_VALUES = frozenset({"--db", "--mail", "--retry-queue", "--from", "--jobs", "--templates"})
GLOBAL_FLAGS = frozenset({"-v", "-vv", "-vvv", "--verbose"})


def hoist_global_options(argv: list[str]) -> list[str]:
    """Move global options given after the command to before it (where typer reads them)."""
    head: list[str] = []
    index = 0
    while index < len(argv) and argv[index].startswith("-"):  # options before the command
        head.append(argv[index])
        if argv[index] in GLOBAL_VALUES and index + 1 < len(argv):
            index += 1
            head.append(argv[index])
        index += 1
    moved: list[str] = []
    rest: list[str] = []
    tail = argv[index:]
    i = 0
    while i < len(tail):
        arg = tail[i]
        if arg == "--":
            rest += tail[i:]
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_VALUES:
            moved.append(arg)
            if "=" not in arg and i + 1 < len(tail):
                i += 1
                moved.append(tail[i])
        elif arg in GLOBAL_FLAGS:
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    return [*head, *moved, *rest]


def main() -> None:
    """Console-script entry point: usage errors as one line, exit 2."""
    try:
        code = app(
            args=hoist_global_options(sys.argv[1:]), prog_name="batchrun", standalone_mode=False
        )
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

"""The command line: thin typer commands that parse, delegate and exit with the contract's code.

app.py     the app, global options, settings, jobs, the runtime, errors -> exit codes
jobs.py    birthday, run, jobs, submit, preview
queue.py   retry, worker
status.py  status
db.py      db migrate, db seed, db explain
output.py  the progress bar and tables
"""

from __future__ import annotations

import sys

import typer

from batchrun.cli import db, jobs, queue, status
from batchrun.cli.app import app

try:  # typer 0.2x vendors click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

__all__ = ["app", "db", "jobs", "main", "queue", "status"]


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

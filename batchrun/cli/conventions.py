"""The conventions every command follows, in one place for every command module to use.

- Help: metavars in capitals with no types (``--db URL``, ``--concurrency N``), no range
  suffix, defaults shown plainly (``[default: sqlite:///batchrun.db]``), arguments written
  one way (``JOB``, ``[JOB]`` when optional), and an ``Examples:`` section from
  ``examples(...)`` passed as the command's ``epilog``. ``apply(app)`` once every command
  is registered (``batchrun/cli/__init__.py`` does).
- Output: ``print_table`` / ``print_pairs`` draw a rich table on a terminal and plain
  columns (no box drawing, nothing cut, no wrapping) when stdout is a pipe or a file;
  ``say`` writes one line to stderr, never hard-wrapped.
- A closed stdout (``| head``) ends the command quietly with 141 (``reader_gone``).
- ``did_you_mean`` for an unknown name; ``output_file`` for an option naming a file to
  write (a usage error, before any work, when it cannot be one).

A new command needs nothing but ``epilog=examples(...)`` and these printers:

    @app.command("runs", epilog=examples("batchrun runs birthday --since 7d"))
    def runs(...): ...
"""

from __future__ import annotations

import difflib
import inspect
import os
import select
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from batchrun.errors import UsageError

# The exit status of a program that SIGPIPE ended, as `git log | head` leaves it.
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


def stdout_gone() -> bool:
    """Whether stdout's reader has gone away (a pipe whose read end is closed), as opposed
    to a BrokenPipeError from some other pipe or socket (a job's own), which is an error."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), no fd (a test's stdout)
        return False


def reader_gone() -> NoReturn:
    """Stdout's reader went away (``batchrun runs --json | head -1``): nothing to say; stdout
    goes nowhere so the interpreter's last flush is quiet, and the exit status is 141."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(BROKEN_PIPE_EXIT)


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich's own exits 1, as if batchrun had failed
        self.quiet = True
        reader_gone()


stdout = _Console(soft_wrap=True)
stderr = _Console(stderr=True, soft_wrap=True)

# The metavar of an option whose name says little about its value; any other option that
# takes a value shows its own name in capitals (--period PERIOD), a number shows N.
METAVARS = {
    "--db": "URL",
    "--mail": "URL",
    "--retry-queue": "URL",
    "--queue": "URL",
    "--fan-out": "URL",
    "--from": "ADDR",
    "--rate": "PER_S|auto",
    "--month": "YYYY-MM",
    "--html": "FILE",
    "--textfile": "PATH",
    "--max": "N",
    "--visibility": "S",
    "--idle-exit": "S",
    "--id": "ID",
    "--users": "N",
    "--seed": "N",
}


def examples(*lines: str) -> str:
    """A command's ``Examples:`` section (its ``epilog``): one command a line, kept as written.

    A line starting with ``#`` is a comment shown as it is.
    """
    body = "\n".join(f"  {line}" for line in lines)
    return f"\b\nExamples:\n{body}"


def metavar_of(param: Any) -> str:
    """The metavar ``param`` shows: set explicitly, from ``METAVARS``, N for a number, else
    its name in capitals; "" for a flag."""
    if isinstance(param, TyperArgument):
        return str(param.metavar or (param.name or "").upper())
    if param.is_flag or param.count:
        return ""
    if param.metavar:
        return str(param.metavar)
    long: str = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    if long in METAVARS:
        return METAVARS[long]
    if param.bare_type() in ("int", "float", "list[int]", "list[float]"):
        return "N"
    return long.lstrip("-").replace("-", "_").upper()


class PlainOption(TyperOption):
    """An option as help shows it here: its metavar, no type, no range, a plain default."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return self.metavar

    def _get_number_range_help_str(self) -> str | None:
        return None

    def _get_default_string(self, **kwargs: Any) -> str:
        if self.is_flag or self.count:
            return ""
        if isinstance(self.show_default, str):
            return self.show_default
        return str(super()._get_default_string(**kwargs))


class PlainArgument(TyperArgument):
    """An argument written one way: ``JOB``, or ``[JOB]`` when it may be left out."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _get_number_range_help_str(self) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")


def _plain_params(params: Iterable[Any]) -> None:
    for param in params:
        if isinstance(param, PlainOption | PlainArgument):
            continue
        if isinstance(param, TyperOption):
            param.metavar = metavar_of(param)
            param.__class__ = PlainOption
        elif isinstance(param, TyperArgument):
            param.metavar = metavar_of(param)
            param.__class__ = PlainArgument


class _HelpFlag:
    """``--help`` / ``-h`` is a flag, shown without a ``<bool>``."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class PlainCommand(_HelpFlag, TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)
        _plain_params(params)  # typer adds some (completion) after __init__
        return params


class PlainGroup(_HelpFlag, TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)
        _plain_params(params)  # typer adds some (completion) after __init__
        return params


def reflow(text: str) -> str:
    """A docstring as help: each paragraph one line, for rich to wrap at the terminal's width.

    typer keeps a docstring's line breaks after its first paragraph, and rich then wraps
    those lines again, breaking sentences mid-way. A paragraph starting with ``\\b`` (click's
    marker for "keep these lines") is left as written.
    """
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def apply(typer_app: typer.Typer) -> None:
    """Reflow the help and give every command and group of ``typer_app`` (and its sub-apps)
    the plain parameters above (call it once every command is registered)."""
    typer_app.info.cls = PlainGroup
    for command in typer_app.registered_commands:
        text = command.help if command.help is not None else inspect.getdoc(command.callback)
        if text:
            command.help = reflow(text)
        if command.cls in (None, TyperCommand):
            command.cls = PlainCommand
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            apply(group.typer_instance)


def commands_without_examples(typer_app: typer.Typer, prefix: str = "batchrun") -> list[str]:
    """Every command of ``typer_app`` whose help has no ``Examples:`` section (for tests)."""
    missing = []
    for command in typer_app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        if "Examples:" not in (command.epilog or ""):
            missing.append(f"{prefix} {name}")
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            missing += commands_without_examples(group.typer_instance, f"{prefix} {group.name}")
    return missing


# -- output ----------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def plain_lines(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Aligned columns, two spaces apart, nothing cut: what a pipe or a file gets."""
    cells = [[_cell(v) for v in row] for row in rows]
    grid = [list(headers), *cells] if headers else cells
    if not grid:
        return []
    widths = [max(len(row[i]) for row in grid if i < len(row)) for i in range(len(grid[0]))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in grid]


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    console: Console | None = None,
) -> None:
    """A table: rich on a terminal; plain columns under a title line when piped."""
    out = console or stdout
    if out.is_terminal:
        table = Table(*headers, title=title)
        for row in rows:
            table.add_row(*(Text(_cell(v)) for v in row))  # text, not markup: '[/path]'
        out.print(table)
        return
    if title:
        out.print(title, highlight=False, markup=False)
    for line in plain_lines(headers, rows):
        out.print(line, highlight=False, markup=False)


def print_pairs(title: str, pairs: Mapping[str, Any], *, console: Console | None = None) -> None:
    """A two-column ``name value`` table (a summary): rich on a terminal, plain when piped."""
    out = console or stdout
    if out.is_terminal:
        table = Table(title=title, show_header=False, min_width=len(title) + 2)
        table.add_column("", style="bold")
        table.add_column("", justify="right")
        for key, value in pairs.items():
            table.add_row(Text(key), Text(_cell(value)))
        out.print(table)
        return
    out.print(title, highlight=False, markup=False)
    for line in plain_lines([], [(k, v) for k, v in pairs.items()]):
        out.print(line, highlight=False, markup=False)


def say(text: str) -> None:
    """One line on stderr, as written (no markup, never wrapped)."""
    stderr.print(text, highlight=False, markup=False, soft_wrap=True)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ""."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def output_file(option: str, path: Path) -> Path:
    """``path``, given to ``option`` as a file for a command to write.

    Raises:
        UsageError: it names a folder, or a file in a folder that does not exist (exit 2),
            so a command fails before its work rather than after it.
    """
    if not path.name or path.is_dir():
        raise UsageError(f"{option} {str(path)!r}: a folder, not a file")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {str(path)!r}: no folder {str(path.parent)!r}")
    return path

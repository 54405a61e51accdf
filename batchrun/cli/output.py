"""What the commands print: a progress bar on stderr (when it is a terminal) and tables."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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
from batchrun.cli.app import stderr, stdout

STATE_NAMES = {0: "pending", 1: "sent", 2: "skipped", 3: "retrying", 4: "failed"}
_HIDDEN = ("job", "month", "period", "dry_run")


class _RateColumn(ProgressColumn):
    """Entities per second."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="cyan")


class Bar:
    def __init__(self, progress: Progress, task_id: Any) -> None:
        self._progress = progress
        self._task = task_id

    def set_total(self, total: int | None) -> None:
        self._progress.update(self._task, total=total)

    def advance(self, event: engine.Progress) -> None:
        if event.kind != "total":
            self._progress.advance(self._task, event.count)


@contextlib.contextmanager
def progress_bar(quiet: bool, title: str) -> Iterator[Bar | None]:
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
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    )
    with progress:
        yield Bar(progress, progress.add_task(title, total=None))


def table(title: str, data: dict[str, Any]) -> None:
    """A two-column summary table of ``data`` (None values and the run's names left out)."""
    out = Table(title=title, show_header=False)
    out.add_column("", style="bold")
    out.add_column("", justify="right")
    for key, value in data.items():
        if key in _HIDDEN or value is None:
            continue
        out.add_row(key.replace("_", " "), str(value))
    stdout.print(out)

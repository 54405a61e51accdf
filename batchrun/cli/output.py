"""What the commands print: a progress bar on stderr (when it is a terminal), tables, and
the lines under a run's summary."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
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
from rich.text import Text

from batchrun.cli.conventions import print_pairs, stderr
from batchrun.pipeline import engine
from batchrun.pipeline.reports import Summary

STATE_NAMES = {0: "pending", 1: "sent", 2: "skipped", 3: "retrying", 4: "failed"}
_HIDDEN = ("job", "month", "period", "dry_run")
# The rows a run's summary always shows; the others (not_queued, lost_claims, continuation,
# throttles ...) only when they are not 0 / False. --json keeps every key.
ASKED = frozenset(
    {"eligible", "succeeded", "skipped", "failed", "emails_sent", "processed", "remaining"}
    | {"shards", "users", "duration_s"}
)


class _RateColumn(ProgressColumn):
    """Entities per second."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="cyan")


class Bar:
    """Counts the entities a run worked on, and shows them on a progress bar if there is one."""

    def __init__(self, progress: Progress | None, task_id: Any = None) -> None:
        self._progress = progress
        self._task = task_id
        self.worked = 0  # entities done, skipped or failed in this run

    def set_total(self, total: int | None, completed: int = 0) -> None:
        """The bar's total and where it starts (entities done by earlier runs)."""
        if self._progress is not None:
            self._progress.update(self._task, total=total, completed=completed)

    def describe(self, text: str) -> None:
        """The bar's title (``paused`` added while `batchrun pause` holds the run)."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def advance(self, event: engine.Progress) -> None:
        if event.kind != "total":
            self.worked += event.count
            if self._progress is not None:
                self._progress.advance(self._task, event.count)


@dataclass(frozen=True)
class MonthTally:
    """How much of a job's period is done, from ``status`` before a run: the bar's total."""

    done_before: int  # done, skipped or failed for good by earlier runs
    pending: int  # still to do: never touched, claimed or retrying

    @classmethod
    def of(cls, counts: dict[str, Any]) -> MonthTally | None:
        """None when the job's status does not count what is pending."""
        pending = counts.get("pending")
        if not isinstance(pending, int):
            return None
        done = sum(int(counts.get(k) or 0) for k in ("succeeded", "skipped", "failed_permanent"))
        return cls(done, pending)

    @property
    def total(self) -> int:
        """Every eligible entity of the period."""
        return self.done_before + self.pending

    def bar_total(self, limit: int | None) -> int:
        return self.done_before + (self.pending if limit is None else min(limit, self.pending))

    def left(self, worked: int) -> int:
        """Entities of the period still to do after this run worked on ``worked``."""
        return max(0, self.total - self.done_before - worked)

    def say(self, worked: int) -> str:
        """The line after a run that stopped (or hit --limit) with some of the period to do."""
        earlier = f", {self.done_before} by earlier runs" if self.done_before else ""
        return (
            # Not "eligible": the summary's eligible is what this run took on.
            f"done {self.done_before + worked} of the period's {self.total} ({worked} in this "
            f"run{earlier}); {self.left(worked)} still to do: the same command goes on"
        )


@contextlib.contextmanager
def progress_bar(quiet: bool, title: str) -> Iterator[Bar]:
    """A progress bar on stderr when it is a terminal (a counter alone otherwise)."""
    if quiet or not stderr.is_terminal:
        yield Bar(None)
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        _RateColumn(),
        TextColumn("elapsed", style="dim"),
        TimeElapsedColumn(),
        TextColumn("remaining", style="dim"),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    )
    with progress:
        yield Bar(progress, progress.add_task(title, total=None))


def shown(data: dict[str, Any], always: Collection[str] | None) -> dict[str, Any]:
    """The rows a table shows: not the run's names, not None; with ``always`` given, a 0 or
    False only for the keys in it."""
    return {
        key: value
        for key, value in data.items()
        if key not in _HIDDEN
        and value is not None
        and (always is None or key in always or value not in (0, False))
    }


def _word(value: Any) -> Any:
    """A flag as a person reads it (``paused yes``), not as Python prints it."""
    return ("yes" if value else "no") if isinstance(value, bool) else value


def table(title: str, data: dict[str, Any], always: Collection[str] | None = None) -> None:
    """A two-column table of ``data`` (see ``shown``: pass ``always`` to hide zero rows);
    plain ``name  value`` lines when stdout is not a terminal."""
    rows = shown(data, always)
    backends = rows.pop("backends", None) or {}
    pairs = {key.replace("_", " "): _word(value) for key, value in rows.items()}
    for name, figures in backends.items():  # one row per named backend
        pairs[f"backend {name}"] = ", ".join(
            f"{key.replace('_', ' ')} {'-' if value is None else value}"
            for key, value in figures.items()
        )
    print_pairs(title, pairs)


def say_unrecorded(summary: Summary) -> None:
    """The line telling entities worked whose outcome the run did not see written."""
    if summary.unrecorded:
        stderr.print(
            f"{summary.unrecorded} entities were worked but the run ended before their "
            "outcome was recorded: a rerun works again any the ledger does not have",
            highlight=False,
        )


def say_why_failed(summary: Summary, status: str) -> None:
    """The commonest reasons entities failed in the run, a line each, under its table."""
    common = summary.common_failures()
    for reason, count in common:
        stderr.print(f"{count} failed: {escape(reason)}", highlight=False, soft_wrap=True)
    others = len(summary.failure_reasons) - len(common)
    if others:
        stderr.print(
            f"... and {others} other reason{'s' if others > 1 else ''}: `{status}` lists them",
            highlight=False,
            soft_wrap=True,
        )

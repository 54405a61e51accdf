"""``batchrun runs`` (the run history) and ``batchrun status`` with no job (every job's
last run, what runs now, the queue depths)."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from batchrun.cli.app import Invocation, app, run_command
from batchrun.cli.conventions import examples, print_table, stdout
from batchrun.control.history import SERVING, History, iso
from batchrun.control.steering import Control, Controls
from batchrun.runtime.resources import open_backends
from batchrun.task import is_task

_SPAN = re.compile(r"^(\d+)([dhm])$")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60}
# the counts a table row shows of a run's summary, in this order
_SHOWN_COUNTS = ("eligible", "processed", "succeeded", "done", "skipped", "failed")
_SHOWN_IF_ANY = ("queued_for_retry", "dead_lettered", "left_pending")


def since_ms(text: str | None, *, now: float | None = None, hint: str = "--since") -> int:
    """``--since``: ``7d``, ``12h``, ``30m`` ago, or a date ``YYYY-MM-DD`` (UTC); 0 if None."""
    if text is None:
        return 0
    now = time.time() if now is None else now
    span = _SPAN.match(text.strip())
    if span:
        # No further back than the epoch: a span of 10**20 days is "every run".
        return max(0, int((now - min(int(span[1][:15]), 10**12) * _UNIT_S[span[2]]) * 1000))
    try:
        day = datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: use a span such as 7d, 12h or 30m, or a date YYYY-MM-DD",
            param_hint=hint,
        ) from None
    return int(day.timestamp() * 1000)


def short_counts(counts: dict[str, Any] | None) -> str:
    """A run's counts in a few words: ``eligible 120, succeeded 118, failed 2``."""
    if not counts:
        return ""
    words = [f"{k} {counts[k]}" for k in _SHOWN_COUNTS if isinstance(counts.get(k), int)]
    words += [f"{k} {counts[k]}" for k in _SHOWN_IF_ANY if counts.get(k)]
    if counts.get("stopped"):
        words.append(f"stopped: {counts['stopped']}")
    if counts.get("paused"):
        words.append("paused")
    return ", ".join(words)


def _when(ms: int | None) -> str:
    text = iso(ms)
    return "" if text is None else text[:19].replace("T", " ")


@app.command(
    "runs",
    epilog=examples(
        "batchrun runs",
        "batchrun runs birthday --since 7d",
        "batchrun runs --since 2025-06-01 --limit 100 --json",
    ),
)
def runs(
    ctx: typer.Context,
    job: Annotated[str | None, typer.Argument(help="Only this job's runs.")] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="7d|YYYY-MM-DD", help="Runs started since then."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Most runs shown.")] = 20,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print a JSON list of the runs.")
    ] = False,
) -> None:
    """The run history, newest first: every run, retry, worker, Lambda invocation and events
    drain, with its host, times, exit code, outcome and counts.

    A run whose heartbeat stopped without an end (kill -9, a lost host) reads `crashed`
    once its lease has passed. For a task job, also the workers, Lambda invocations and
    retry drains that serve every job (they run its tasks).
    """
    context: Invocation = ctx.obj
    settings = context.settings
    start = since_ms(since)

    async def go() -> int:
        async with open_backends(settings) as backends:
            history = History(backends.store.db, lease_s=settings.lease_s)
            entry = context.registry.get(job) if job is not None else None
            if job is not None and entry is not None and is_task(entry.job):
                rows = await history.runs_serving(job, since_ms=start, limit=limit)
            else:
                rows = await history.runs(job, since_ms=start, limit=limit)
            if job is not None and entry is None and not rows and not await history.runs(job):
                # A job no process here knows, with no history either: a typo, or one of
                # the team's own not loaded (a task job's runs are found through --jobs).
                context.registry.entry(job)  # the "unknown job" error, exit 2
        if as_json:
            print(json.dumps([r.to_json() for r in rows]))
            return 0
        if not rows:
            stdout.print(
                "no runs recorded yet" if since is None else f"no runs since {since}",
                highlight=False,
            )
            return 0
        headers = ("id", "job", "period", "kind", "started (UTC)", "took", "outcome", "exit")
        print_table(
            (*headers, "host:pid", "counts"),
            [
                (
                    r.id,
                    r.job,
                    r.period,
                    r.kind,
                    _when(r.started_at),
                    f"{r.duration_s:.1f}s",
                    r.outcome,
                    r.exit_code,
                    f"{r.host}:{r.pid}",
                    short_counts(r.counts) + (f" error: {r.error}" if r.error else ""),
                )
                for r in rows
            ],
        )
        return 0

    run_command(ctx, go)


async def overview(context: Invocation) -> dict[str, Any]:
    """``status`` with no job: per job its last run, what runs now and whether it is
    paused; the runs serving every job; the queue depths. A task job's runs are the
    workers, Lambda invocations and retry drains that serve it (``runs TASKJOB``)."""
    settings = context.settings
    names = list(context.registry)
    tasks = [name for name, entry in context.registry.items() if is_task(entry.job)]
    async with open_backends(settings, queue=True) as backends:
        history = History(backends.store.db, lease_s=settings.lease_s)
        last = await history.last_per_job()
        running = await history.running()
        last_served = {name: await history.last_serving(name) for name in tasks}
        controls = await Controls(backends.store.db).rows()
        assert backends.queue is not None
        depth, dead = await backends.queue.depths()
    jobs: dict[str, Any] = {}
    for name in [*names, *sorted(set(last) - set(names))]:
        held = [c for c in controls if c.job == name and c.paused]
        ended, now = last.get(name), [r for r in running if r.job == name]
        if name in last_served:
            ended = last_served[name]  # its own runs are among those serving it
            now = [r for r in running if r.job == name or (r.job is None and r.kind in SERVING)]
        jobs[name] = {
            "last_run": ended.to_json() if ended is not None else None,
            "running": [r.to_json() for r in now],
            "paused": [_paused(c) for c in held],
        }
    return {
        "jobs": jobs,
        "serving": [r.to_json() for r in running if r.job is None],
        "retry_queue_depth": depth,
        "dead_letter_depth": dead,
    }


def _paused(control: Control) -> dict[str, Any]:
    return {
        "period": control.period or None,
        "reason": control.reason,
        "since": iso(control.paused_at),
    }


def print_overview(data: dict[str, Any]) -> None:
    """The overview as tables: jobs, then the processes serving every job."""
    rows = []
    for name, job in data["jobs"].items():
        last = job["last_run"]
        now = [_live(r) for r in job["running"]]
        paused = [
            (p["period"] or "every period") + (f" ({p['reason']})" if p["reason"] else "")
            for p in job["paused"]
        ]
        rows.append(
            (
                name,
                last["started_at"][:19].replace("T", " ") if last else "never",
                f"{last['duration_s']:.1f}s" if last else "",
                last["outcome"] if last else "",
                short_counts(last["counts"]) if last else "",
                "; ".join(now),
                "; ".join(paused),
            )
        )
    headers = ("job", "last run (UTC)", "took", "outcome", "counts", "running now", "paused")
    print_table(headers, rows)
    if data["serving"]:
        print_table(
            ("kind", "host:pid", "since (UTC)", "progress"),
            [
                (
                    r["kind"],
                    f"{r['host']}:{r['pid']}",
                    r["started_at"][:19].replace("T", " "),
                    short_counts(r["counts"]),
                )
                for r in data["serving"]
            ],
            title="serving every job",
        )
    stdout.print(
        f"retry queue {data['retry_queue_depth']}, dead letters {data['dead_letter_depth']}",
        highlight=False,
    )


def _live(row: dict[str, Any]) -> str:
    progress = short_counts(row["counts"])
    where = f"{row['period'] or ''} {row['kind']} {row['host']}:{row['pid']}".strip()
    return where + (f" ({progress})" if progress else "")

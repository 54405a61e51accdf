"""Prometheus metrics: what the ledger, the queue and the run history say now.

``collect`` reads (one grouped ledger query, the queue's depths, the runs' last rows);
``render`` turns that into the text exposition format; ``write_textfile`` writes it
atomically for node_exporter's textfile collector (a temporary file in the same folder,
then a rename: the collector never reads half a file).

    batchrun_entities{job,period,state}            ledger rows
    batchrun_queue_depth{queue}                     retry (waiting or in flight), dead
    batchrun_last_run_timestamp_seconds{job,outcome}  when the last run of each outcome ended
    batchrun_last_success_timestamp_seconds{job}    when the last ``ok`` run ended
    batchrun_run_duration_seconds{job}              how long the last finished run took
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from batchrun.db.store import Store
from batchrun.queue.base import WorkQueue

STATE_NAMES = {0: "pending", 1: "sent", 2: "skipped", 3: "retrying", 4: "failed"}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class LastRun:
    """A job's latest finished run of one outcome: when it ended and how long it took."""

    job: str
    outcome: str
    ended_s: float  # epoch seconds
    duration_s: float


@dataclass(slots=True)
class Snapshot:
    """What the metrics show, read at one moment."""

    entities: list[tuple[str, str, str, int]] = field(default_factory=list)
    queue_depths: dict[str, int] = field(default_factory=dict)
    last_runs: list[LastRun] = field(default_factory=list)


async def collect(
    store: Store, queue: WorkQueue | None, *, last_runs: Sequence[LastRun] = ()
) -> Snapshot:
    """Read the ledger's counts and the queue's depths now; ``last_runs`` from the history."""
    snapshot = Snapshot(last_runs=list(last_runs))
    for job, period, state, count in await store.db.fetchall("metrics_entities"):
        name = STATE_NAMES.get(int(state), str(state))
        snapshot.entities.append((str(job), str(period), name, int(count)))
    if queue is not None:
        waiting, dead = await queue.depths()
        snapshot.queue_depths["retry"] = waiting
        if dead is not None:
            snapshot.queue_depths["dead"] = dead
    return snapshot


async def last_runs(store: Store) -> list[LastRun]:
    """Each job's latest finished run of each outcome, from the run history."""
    rows = await store.db.fetchall("metrics_last_runs")
    return [
        LastRun(str(job), str(outcome), int(ended) / 1000, max(0, int(ended) - int(started)) / 1000)
        for job, outcome, ended, started in rows
    ]


def registry(snapshot: Snapshot) -> CollectorRegistry:
    """The snapshot as gauges in a registry of their own (no process metrics)."""
    reg = CollectorRegistry(auto_describe=True)
    entities = Gauge(
        "batchrun_entities",
        "Ledger rows by job, period and state.",
        ["job", "period", "state"],
        registry=reg,
    )
    for job, period, state, count in snapshot.entities:
        entities.labels(job, period, state).set(count)
    depth = Gauge(
        "batchrun_queue_depth",
        "Messages on the retry and dead-letter queues.",
        ["queue"],
        registry=reg,
    )
    for name, count in snapshot.queue_depths.items():
        depth.labels(name).set(count)
    last_run = Gauge(
        "batchrun_last_run_timestamp_seconds",
        "When the job's last run of each outcome ended (Unix time).",
        ["job", "outcome"],
        registry=reg,
    )
    last_ok = Gauge(
        "batchrun_last_success_timestamp_seconds",
        "When the job's last successful run ended (Unix time).",
        ["job"],
        registry=reg,
    )
    duration = Gauge(
        "batchrun_run_duration_seconds",
        "How long the job's last finished run took.",
        ["job"],
        registry=reg,
    )
    latest: dict[str, LastRun] = {}
    for run in snapshot.last_runs:
        last_run.labels(run.job, run.outcome).set(run.ended_s)
        if run.outcome == "ok":
            last_ok.labels(run.job).set(run.ended_s)
        if run.job not in latest or run.ended_s > latest[run.job].ended_s:
            latest[run.job] = run
    for job, run in latest.items():
        duration.labels(job).set(run.duration_s)
    return reg


def render(snapshot: Snapshot) -> bytes:
    """The Prometheus text exposition of ``snapshot``."""
    return generate_latest(registry(snapshot))


def write_textfile(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then a rename."""
    folder = path.parent if str(path.parent) else Path(".")
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise

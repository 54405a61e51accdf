"""Run history: the ``batchrun_run`` rows every run, ``retry`` drain, ``worker`` process,
Lambda invocation and ``events`` drain writes (see DESIGN.md, "See and steer").

A row is inserted when the process starts (``outcome`` 'running'), its ``heartbeat_at``
(and its ``counts`` so far) renewed while it works, and it is ended with the exit code,
the outcome and the JSON summary. A row still 'running' whose heartbeat is older than
the lease reads 'crashed' (computed on read); the next run to start marks such rows
'crashed' for good.

Outcomes by exit code: 0 ok, 3 retrying, 1 (or 2) failed, 130 stopped (a signal) or
cancelled (``batchrun cancel``).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from batchrun.db.base import Database, Row
from batchrun.db.store import patiently

Kind = Literal["run", "retry", "worker", "lambda", "events"]
Outcome = Literal["ok", "retrying", "failed", "stopped", "cancelled", "crashed", "running"]
KINDS: tuple[Kind, ...] = get_args(Kind)
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
CANCELLED = "cancelled"  # the stop reason a `batchrun cancel` gives
MAX_ERROR_CHARS = 500
# How long a start or an end of a run's row waits out a lock on the history (a long
# transaction): a run is delayed that long, not ended; past it the lock's error is told.
HISTORY_PATIENCE_S = 60.0
NO_LIMIT = 10**9
# Kinds of run that serve every job's queue messages (a task job's tasks among them): their
# rows name no job (runs_serving_job matches the same kinds).
SERVING = ("worker", "lambda", "retry")


def outcome_of(exit_code: int, stopped: str | None = None) -> Outcome:
    """The outcome a process that ended with ``exit_code`` records."""
    if exit_code == 0:
        return "ok"
    if exit_code == 3:
        return "retrying"
    if exit_code == 130:
        return "cancelled" if stopped == CANCELLED else "stopped"
    return "failed"


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC (``2025-06-01T02:00:00.123Z``)."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class RunRow:
    """One ``batchrun_run`` row; times are epoch ms."""

    id: int
    job: str | None
    period: str | None
    kind: str
    host: str
    pid: int
    version: str
    started_at: int
    heartbeat_at: int
    ended_at: int | None
    exit_code: int | None
    outcome: str
    counts: dict[str, Any] | None
    error: str | None

    @classmethod
    def of(cls, row: Row) -> RunRow:
        counts = json.loads(row[12]) if row[12] else None
        return cls(
            id=int(row[0]),
            job=row[1],
            period=row[2],
            kind=str(row[3]),
            host=str(row[4]),
            pid=int(row[5]),
            version=str(row[6]),
            started_at=int(row[7]),
            heartbeat_at=int(row[8]),
            ended_at=None if row[9] is None else int(row[9]),
            exit_code=None if row[10] is None else int(row[10]),
            outcome=str(row[11]),
            counts=counts if isinstance(counts, dict) else None,
            error=row[13],
        )

    @property
    def duration_s(self) -> float:
        """How long it ran (until its last heartbeat for one that has not ended)."""
        end = self.ended_at if self.ended_at is not None else self.heartbeat_at
        return round(max(0, end - self.started_at) / 1000, 3)

    def to_json(self) -> dict[str, Any]:
        """The row as ``batchrun runs --json`` prints it: times in ISO 8601 UTC."""
        return {
            "id": self.id,
            "job": self.job,
            "period": self.period,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started_at": iso(self.started_at),
            "heartbeat_at": iso(self.heartbeat_at),
            "ended_at": iso(self.ended_at),
            "duration_s": self.duration_s,
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "counts": self.counts,
            "error": self.error,
        }


class History:
    """Reads and writes ``batchrun_run`` over a Database.

    ``lease_s`` is how long a heartbeat stays good: a 'running' row whose last heartbeat
    is older reads 'crashed'. Its times are on the database server's clock, as the
    leases' are: hosts whose clocks differ by minutes see the same runs alive.
    """

    def __init__(self, db: Database, *, lease_s: float) -> None:
        self.db = db
        self.lease_ms = int(lease_s * 1000)

    async def _stale(self) -> int:
        return await self.db.clock_ms() - self.lease_ms

    async def start(self, *, kind: Kind, job: str | None, period: str | None) -> int:
        """Insert a 'running' row for this process; return its id. Rows of dead runs are
        marked 'crashed' first."""
        from batchrun import __version__  # not at import: batchrun imports the runtime

        now = await self.db.clock_ms()
        # Each statement waits out a lock another session holds on its own (a lock wait
        # undid it): the insert is never made twice, as a retry of the whole would.
        await patiently(
            "run history",
            lambda: self.db.execute("run_mark_crashed", stale=now - self.lease_ms),
            patience_s=HISTORY_PATIENCE_S,
        )
        host, pid = socket.gethostname()[:255], os.getpid()
        params = {"host": host, "pid": pid, "kind": kind, "now": now}
        await patiently(
            "run history",
            lambda: self.db.execute(
                "run_insert", job=job, period=period, version=__version__[:32], **params
            ),
            patience_s=HISTORY_PATIENCE_S,
        )
        found = await patiently(
            "run history",
            lambda: self.db.fetchval("run_find", **params),
            patience_s=HISTORY_PATIENCE_S,
        )
        return int(found)

    async def beat(self, run_id: int, counts: dict[str, Any] | None) -> None:
        """Renew the row's heartbeat, with the counts so far."""
        now = await self.db.clock_ms()
        await self.db.execute("run_beat", id=run_id, now=now, counts=_dump(counts))

    async def end(
        self,
        run_id: int,
        *,
        exit_code: int,
        outcome: Outcome,
        counts: dict[str, Any] | None,
        error: str | None = None,
    ) -> None:
        """End the row (``error``: one line, already masked); a lock another session holds
        on the history is waited out for up to ``HISTORY_PATIENCE_S``."""
        now = await self.db.clock_ms()
        await patiently(
            "run history",
            lambda: self.db.execute(
                "run_end",
                id=run_id,
                now=now,
                exit_code=exit_code,
                outcome=outcome,
                counts=_dump(counts),
                error=error[:MAX_ERROR_CHARS] if error else None,
            ),
            patience_s=HISTORY_PATIENCE_S,
        )

    async def runs(
        self, job: str | None = None, *, since_ms: int = 0, limit: int = 50
    ) -> list[RunRow]:
        """Rows started at or after ``since_ms``, newest first (of ``job`` only, if given)."""
        params = {"since": since_ms, "limit": min(limit, NO_LIMIT), "stale": await self._stale()}
        if job is None:
            rows = await self.db.fetchall("runs_all", **params)
        else:
            rows = await self.db.fetchall("runs_of_job", job=job, **params)
        return [RunRow.of(r) for r in rows]

    async def runs_serving(self, job: str, *, since_ms: int = 0, limit: int = 50) -> list[RunRow]:
        """A task job's runs started at or after ``since_ms``, newest first: its own, and
        those serving every job (``SERVING``), which run its tasks."""
        params = {"job": job, "since": since_ms, "limit": min(limit, NO_LIMIT)}
        params["stale"] = await self._stale()
        return [RunRow.of(r) for r in await self.db.fetchall("runs_serving_job", **params)]

    async def last_serving(self, job: str) -> RunRow | None:
        """A task job's newest run that is over (ended or crashed): its own, or one of
        those serving every job (``SERVING``)."""
        row = await self.db.fetchone("run_last_serving_job", job=job, stale=await self._stale())
        return RunRow.of(row) if row is not None else None

    async def get(self, run_id: int) -> RunRow | None:
        """One row by id."""
        row = await self.db.fetchone("run_get", id=run_id, stale=await self._stale())
        return RunRow.of(row) if row is not None else None

    async def running(self) -> list[RunRow]:
        """The rows whose process is alive (its heartbeat within the lease), newest first."""
        return [
            RunRow.of(r) for r in await self.db.fetchall("runs_running", stale=await self._stale())
        ]

    async def last_per_job(self) -> dict[str, RunRow]:
        """Each job's newest run that is over (ended or crashed)."""
        rows = await self.db.fetchall("runs_last_per_job", stale=await self._stale())
        return {str(r.job): r for r in map(RunRow.of, rows)}

    async def stale_claims(self, *, job: str, period: str) -> int:
        """Entities of the period claimed by a run that stopped or died, not finished."""
        now = await self.db.clock_ms()  # the leases' clock
        return int(
            await self.db.fetchval("ledger_stale_claims", job=job, period=period, now=now) or 0
        )


def _dump(counts: dict[str, Any] | None) -> str | None:
    return None if counts is None else json.dumps(counts, separators=(",", ":"), default=str)

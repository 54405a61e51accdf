"""Pause, resume and cancel: ``batchrun_control`` rows, and what a running process does
with them (see DESIGN.md, "See and steer").

``pause JOB [--period P]`` sets a row paused (period '' is every period of the job);
``resume`` clears it; ``cancel`` stamps it with the time it was given. Every process
reads the rows at its heartbeat (``Steering.refresh``), whichever host it is on:

- paused: the fence (``Lease.fence``) holds every worker before its next effect, so
  in-flight entities finish and no new one starts; the heartbeat keeps the claims alive.
  A run that starts while its job is paused claims nothing and ends at once (exit 0).
  Queue consumers leave a paused job's messages on the queue for later.
- cancelled: the runs going on when it was given stop as on SIGINT (in-flight entities
  finish, the rest are left pending, exit 130, ``"stopped": "cancelled"``); a run that
  starts later is not affected.

Times are epoch ms on the database server's clock, as the leases' are: a cancel given on
a host whose clock is minutes off stops the runs going on when it was given, no more and
no fewer. A steered run's start is its host's monotonic clock, put on the server's at each
refresh.
"""

from __future__ import annotations

import logging
import math
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchrun.control.history import CANCELLED
from batchrun.db.base import Database
from batchrun.pipeline.engine import StopToken

if TYPE_CHECKING:
    from batchrun.db.store import Scope

log = logging.getLogger(__name__)
EVERY_PERIOD = ""
MAX_REASON_CHARS = 200


def _one_line(text: str) -> str:
    """``text`` as one line for a table cell: control characters (a newline, a terminal's
    escape) become spaces, runs of spaces one."""
    return " ".join("".join(" " if unicodedata.category(c) == "Cc" else c for c in text).split())


@dataclass(frozen=True, slots=True)
class Control:
    """One ``batchrun_control`` row."""

    job: str
    period: str  # '' = every period of the job
    paused: bool
    reason: str | None
    paused_at: int | None
    cancelled_at: int | None


class Controls:
    """Writes and reads ``batchrun_control`` (the commands and the dashboard)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def pause(self, job: str, period: str | None = None, reason: str | None = None) -> None:
        text = _one_line(reason or "")[:MAX_REASON_CHARS] or None
        await self.db.execute(
            "control_pause",
            job=job,
            period=period or EVERY_PERIOD,
            reason=text,
            now=await self.db.clock_ms(),
        )

    async def resume(self, job: str, period: str | None = None) -> bool:
        """Clear the pause (of one period, or of every period of the job); whether one was
        cleared."""
        now = await self.db.clock_ms()
        if period is None:
            changed = await self.db.execute("control_resume_job", job=job, now=now)
        else:
            changed = await self.db.execute(
                "control_resume_period", job=job, period=period, now=now
            )
        return changed > 0

    async def cancel(self, job: str, period: str | None = None) -> None:
        await self.db.execute(
            "control_cancel", job=job, period=period or EVERY_PERIOD, now=await self.db.clock_ms()
        )

    async def rows(self) -> list[Control]:
        return [
            Control(
                job=str(r[0]),
                period=str(r[1]),
                paused=bool(r[2]),
                reason=r[3],
                paused_at=None if r[4] is None else int(r[4]),
                cancelled_at=None if r[5] is None else int(r[5]),
            )
            for r in await self.db.fetchall("control_rows")
        ]


def _matches(row: Control, job: str, period: str | None) -> bool:
    return row.job == job and (row.period == EVERY_PERIOD or row.period == period)


class Working:
    """The jobs (and periods) a queue consumer works now, for ``Steering.steer``: each
    from when a message of it came (``saw``) until ``linger_s`` after the batch that held
    its last one ended (``batch_ended``), a heartbeat or more to read a cancel given
    meanwhile. A cancel given before or after that stops nothing: it is another run's."""

    def __init__(self, linger_s: float) -> None:
        self.linger_s = linger_s
        self._first: dict[Scope, float] = {}  # when this streak of its messages began
        self._ended: dict[Scope, float] = {}  # when its last batch ended (inf: in one now)

    def saw(self, scope: Scope) -> None:
        """A message of ``scope`` is being worked (monotonic time)."""
        now = time.monotonic()
        if self._ended.get(scope, -math.inf) + self.linger_s < now:
            self._first[scope] = now  # a new streak: a cancel before it was another's
        self._ended[scope] = math.inf

    def batch_ended(self) -> None:
        now = time.monotonic()
        for scope, ended in list(self._ended.items()):
            if ended == math.inf:
                self._ended[scope] = now
            elif ended + self.linger_s < now:  # over: forgotten
                del self._ended[scope], self._first[scope]

    def live(self, now: float) -> dict[Scope, float]:
        """The scopes worked now or lately, each with when its streak began."""
        return {s: self._first[s] for s, e in self._ended.items() if e + self.linger_s >= now}


class Steering:
    """A process's view of the control rows, refreshed at its heartbeat, and the work
    it steers: the stop tokens of what runs now, each with the time it started (this
    host's monotonic clock)."""

    def __init__(self) -> None:
        self._rows: list[Control] = []
        self._steered: dict[
            int, tuple[StopToken, str | None, str | None, float, set[Scope] | Working]
        ] = {}
        self._was_paused: set[tuple[str, str]] = set()
        self.on_change: Callable[[], None] | None = None  # a pause began or ended

    def paused(self, job: str, period: str | None) -> Control | None:
        """The row that pauses ``job``'s ``period`` (None: not paused)."""
        for row in self._rows:
            if row.paused and _matches(row, job, period):
                return row
        return None

    def paused_keys(self, job: str, period: str | None) -> dict[str, object]:
        """``status``'s ``paused`` and ``paused_reason`` while ``job``'s ``period`` is
        paused (``batchrun pause``); nothing otherwise."""
        held = self.paused(job, period)
        return {} if held is None else {"paused": True, "paused_reason": held.reason}

    def any_paused(self, scopes: Iterable[Scope]) -> bool:
        return any(self.paused(s.job, s.period) is not None for s in scopes)

    def steer(
        self,
        stop: StopToken,
        *,
        job: str | None = None,
        period: str | None = None,
        scopes: set[Scope] | Working | None = None,
    ) -> Callable[[], None]:
        """Stop ``stop`` (reason 'cancelled') when a cancel given from now on names its
        job (``job`` and ``period``, or any of the live set ``scopes``; of a consumer's
        ``Working``, one given while it works that job); return a function that ends
        this."""
        key = id(stop)
        started = time.monotonic()
        self._steered[key] = (stop, job, period, started, scopes if scopes is not None else set())

        def done() -> None:
            self._steered.pop(key, None)

        return done

    async def refresh(self, db: Database) -> None:
        """Read the control rows; stop what a new cancel names; tell ``on_change``."""
        self._rows = await Controls(db).rows()
        cancels = [row for row in self._rows if row.cancelled_at is not None]
        if cancels and self._steered:
            # The server's time now, less how long ago (on this host) each run started.
            clock, monotonic = await db.clock_ms(), time.monotonic()
            for stop, job, period, started, scopes in list(self._steered.values()):
                since = clock - int((monotonic - started) * 1000)
                # (job, period, the server's time from which a cancel of it counts)
                named = [(job, period, since)] if job is not None else []
                if isinstance(scopes, Working):
                    named += [
                        (s.job, s.period, clock - int((monotonic - first) * 1000))
                        for s, first in scopes.live(monotonic).items()
                    ]
                else:
                    named += [(s.job, s.period, since) for s in scopes]
                for row in cancels:
                    if stop.stopping:
                        break
                    given = row.cancelled_at or 0
                    if any(_matches(row, j, p) and given >= t for j, p, t in named):
                        log.warning("cancelled: %s %s", row.job, row.period or "(every period)")
                        stop.request(CANCELLED)
        now_paused = {(r.job, r.period) for r in self._rows if r.paused}
        if now_paused != self._was_paused:
            self._was_paused = now_paused
            if self.on_change is not None:
                self.on_change()

"""One process's ``batchrun_run`` row for its whole life: inserted at the start, its
heartbeat renewed (with the progress so far, and the control rows read: pause, cancel),
ended with the exit code, the outcome and the counts, then the webhook told.

The CLI commands and the Lambda handler wrap their work in it::

    async with RunRecord(runtime, kind="run", job="birthday", period="2025-06") as record:
        options.on_progress = record.progress(bar.advance)
        summary = await runtime.run(...)
        code = await record.end(summary.exit_code, summary.to_json(), stopped=summary.stopped)

A process that leaves the block without ``end`` (an error, Ctrl-C) ends the row failed
or stopped; one that dies (kill -9) leaves it 'running' until its lease passes, then it
reads 'crashed'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from batchrun.control.history import History, Kind, outcome_of
from batchrun.control.notify import Notifier, payload
from batchrun.errors import BatchrunError
from batchrun.pipeline import engine
from batchrun.urls import mask_text

if TYPE_CHECKING:
    from batchrun.control.steering import Steering
    from batchrun.db.store import Store
    from batchrun.pipeline.stop import StopToken
    from batchrun.queue.base import WorkQueue
    from batchrun.settings import Settings

log = logging.getLogger(__name__)


class Recorded(Protocol):
    """What a record needs of the process it records (the runtime has each)."""

    store: Store
    queue: WorkQueue | None
    settings: Settings
    steering: Steering
    stop: StopToken


class RunRecord:
    """The history row, heartbeat and control poll of one process (see module doc)."""

    def __init__(
        self,
        rt: Recorded,
        *,
        kind: Kind,
        job: str | None = None,
        period: str | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.rt = rt
        self.kind = kind
        self.job = job
        self.period = period
        self.history = History(rt.store.db, lease_s=rt.settings.lease_s)
        self.notifier = notifier if notifier is not None else Notifier.from_env(rt.settings.environ)
        self.run_id: int | None = None
        self.worked: dict[str, int] = {}  # progress so far: done / skipped / failed
        self.ended = False
        self._dead_before: int | None = None
        self._beat: asyncio.Task[None] | None = None
        self._unsteer: Callable[[], None] | None = None

    async def __aenter__(self) -> RunRecord:
        # A lock on the history (a long transaction, a migration) delays the run, as one
        # on the ledger does (History waits it out); it ended the run with exit 1.
        self.run_id = await self.history.start(kind=self.kind, job=self.job, period=self.period)
        self.rt.store.run_id = self.run_id
        await self.rt.steering.refresh(self.rt.store.db)
        if self.job is not None:
            # a cancel given from now on ends this process's run
            self._unsteer = self.rt.steering.steer(self.rt.stop, job=self.job, period=self.period)
        if self.notifier is not None:  # the webhook tells when the dead letters grew
            self._dead_before = await self._dead_letters()
        self._beat = asyncio.create_task(self._heartbeat(), name="batchrun-run-heartbeat")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_beat()
        if self.ended or self.run_id is None:
            return
        if isinstance(exc, BatchrunError):
            settings = self.rt.settings
            text = mask_text(str(exc), settings.db_url, settings.mail_url, settings.retry_queue_url)
            await self._end_quietly(exc.exit_code, None, text)
        elif isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
            await self._end_quietly(130, None, None)
        elif exc is not None:
            await self._end_quietly(1, None, type(exc).__name__)
        else:
            await self._end_quietly(0, None, None)

    def _stop_beat(self) -> None:
        if self._unsteer is not None:
            self._unsteer()
            self._unsteer = None
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

    async def _end_quietly(
        self, exit_code: int, counts: dict[str, Any] | None, error: str | None
    ) -> None:
        with contextlib.suppress(Exception):  # the error that ended the run is the one told
            await self.end(exit_code, counts, error=error)

    def progress(
        self, then: Callable[[engine.Progress], None] | None = None
    ) -> Callable[[engine.Progress], None]:
        """An ``on_progress`` that counts for the heartbeat, then calls ``then``."""

        def on_progress(event: engine.Progress) -> None:
            if event.kind != "total":
                self.worked[event.kind] = self.worked.get(event.kind, 0) + event.count
            if then is not None:
                then(event)

        return on_progress

    def snapshot(self) -> dict[str, Any]:
        """The counts so far, as the heartbeat writes them."""
        snap: dict[str, Any] = dict(self.worked)
        if self.job is not None and self.rt.steering.paused(self.job, self.period):
            snap["paused"] = True
        return snap

    async def _heartbeat(self) -> None:
        assert self.run_id is not None
        while True:
            await asyncio.sleep(self.rt.settings.lease_s / 3)
            try:
                await self.history.beat(self.run_id, self.snapshot())
                await self.rt.steering.refresh(self.rt.store.db)
            except Exception as exc:
                log.warning("run heartbeat failed (tried again): %s", exc)

    async def _dead_letters(self) -> int | None:
        if self.rt.queue is None:
            return None
        try:
            return (await self.rt.queue.depths())[1]
        except Exception:
            return None

    async def end(
        self,
        exit_code: int,
        counts: dict[str, Any] | None,
        *,
        stopped: str | None = None,
        error: str | None = None,
    ) -> int:
        """End the row and tell the webhook; return ``exit_code`` unchanged. A summary
        that ended on an error (``counts["error"]``: the bug threshold) gives the row's
        ``error`` when none is given."""
        self._stop_beat()
        if self.ended or self.run_id is None:
            return exit_code
        self.ended = True
        if error is None and counts is not None and isinstance(counts.get("error"), str):
            settings = self.rt.settings
            error = mask_text(
                counts["error"], settings.db_url, settings.mail_url, settings.retry_queue_url
            )
        outcome = outcome_of(exit_code, stopped)
        await self.history.end(
            self.run_id, exit_code=exit_code, outcome=outcome, counts=counts, error=error
        )
        if self.notifier is not None:
            dead_after = await self._dead_letters() if self._dead_before is not None else None
            grew = dead_after is not None and dead_after > (self._dead_before or 0)
            if self.notifier.wanted(exit_code, dead_letters_grew=grew):
                await self.notifier.send(
                    payload(
                        job=self.job,
                        period=self.period,
                        kind=self.kind,
                        outcome=outcome,
                        exit_code=exit_code,
                        counts=counts,
                        run_id=self.run_id,
                        host=socket.gethostname(),
                        error=error,
                    )
                )
        return exit_code

"""What the two server adapters (MySQL/MariaDB, PostgreSQL) share: a pool of autocommit
connections, one statement per call through the dialect's ``_run``, and the rules for a
lost reply and a lock conflict.

- **A lost connection**: batchrun's own statements (idempotent by construction) go again
  on a fresh connection, up to three times with a growing pause; a job's statement never
  does (``rerun=False``): its outcome is unknown (``OutcomeUnknownError``) and the entity is
  retried as a whole, its own keys making that safe.
- **A lock conflict** (deadlock, lock wait timeout, serialization failure): the server
  rolled the statement back, so it goes again after a short pause, up to three times.
- **No reply at all** (a network that drops packets without resetting the connection: a
  partition, a failover whose old primary vanished): a statement still unanswered after
  the URL's ``reply_timeout`` (seconds, default 60; 0: wait forever) has its connection
  closed, and is then a lost connection as above. Without it, the run waited forever, and
  its heartbeat, on another connection, kept its claims from every other run.
"""

from __future__ import annotations

import asyncio
import logging
import random
from abc import abstractmethod
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from batchrun.db.base import Database, Row
from batchrun.db.sql import Queries
from batchrun.errors import ConfigError, DatabaseError, OutcomeUnknownError
from batchrun.urls import mask_text, mask_url, split

log = logging.getLogger(__name__)

LOST_TRIES = 3
CONFLICT_TRIES = 3
# Seconds a statement waits for its reply before its connection is closed: far above any
# statement of batchrun's own (their lock waits end after 2 s) and a job's page should take.
REPLY_TIMEOUT_S = 60.0


def reply_timeout(url: str) -> float | None:
    """The URL's ``reply_timeout`` in seconds (default ``REPLY_TIMEOUT_S``; 0: None, no limit).

    Raises:
        ConfigError: not a number of at least 0.
    """
    raw = parse_qs(split(url).query).get("reply_timeout", [""])[0]
    if raw == "":
        return REPLY_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < 1e9:
        raise ConfigError(
            f"database URL {mask_url(url)!r} has a bad reply_timeout "
            "(seconds, a number of at least 0; 0 waits forever)"
        )
    return seconds or None


class ReplyDeadline:
    """Closes a connection whose statement has had no reply for ``seconds``: the pending read
    then fails as a lost connection does, and ``expired`` tells the two apart."""

    __slots__ = ("_handle", "expired", "seconds")

    def __init__(self, seconds: float | None, close: Callable[[], object]) -> None:
        self.seconds = seconds
        self.expired = False
        self._handle = (
            None
            if seconds is None
            else asyncio.get_running_loop().call_later(seconds, self._expire, close)
        )

    def _expire(self, close: Callable[[], object]) -> None:
        self.expired = True
        log.warning("database: no reply in %g s; closing the connection", self.seconds)
        close()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def explained(self, exc: BaseException) -> BaseException:
        """``exc``, or when the deadline closed the connection, an error that says so."""
        if not self.expired:
            return exc
        silent = TimeoutError(f"no reply in {self.seconds:g} s (the URL's reply_timeout)")
        silent.__cause__ = exc
        return silent


class ServerDatabase(Database):
    """A pool of autocommit connections; never shares one connection between tasks."""

    def __init__(self, url: str, queries: Queries) -> None:
        super().__init__(queries)
        self._raw_url = url
        self.url = mask_url(url)
        self.reply_timeout_s = reply_timeout(url)

    @abstractmethod
    async def _run(
        self, sql: str, args: tuple[Any, ...], *, fetch: bool, rerun: bool = True
    ) -> tuple[int, list[Row], list[str], bool]:
        """Run one statement: (rowcount, rows, column names, whether it went again after a
        lost connection). ``rerun``: batchrun's own statement, safe to run again after a
        lost reply; a job's statement is not (``OutcomeUnknownError``)."""

    @staticmethod
    @abstractmethod
    def _describe(exc: BaseException) -> str:
        """One line for the driver's error: its code and message."""

    def _masked(self, exc: BaseException) -> str:
        return mask_text(self._describe(exc), self._raw_url)

    async def _after_lost(self, exc: BaseException, lost: int, *, rerun: bool) -> int:
        """After a lost connection: how many so far, once it is safe and worth going again;
        else the error to raise."""
        text = self._masked(exc)
        if not rerun:
            raise OutcomeUnknownError(
                f"database {self.url}: the connection was lost before the statement's reply "
                f"({text}): its outcome is unknown"
            ) from exc
        if lost >= LOST_TRIES:
            raise DatabaseError(f"database {self.url}: {text}") from exc
        log.warning("database connection lost (%s); trying again", text)
        await asyncio.sleep(random.uniform(0.05, 0.15) * 2**lost)
        return lost + 1

    @staticmethod
    async def _after_conflict(conflicts: int) -> int:
        """After a rolled-back conflict the statement may go again: a short pause, longer
        each time, so two sessions in a cycle do not meet again at once."""
        conflicts += 1
        await asyncio.sleep(random.uniform(0.01, 0.05) * conflicts)
        return conflicts

    async def execute(self, name: str, **params: Any) -> int:
        count, _ = await self.execute_reran(name, **params)
        return count

    async def execute_reran(self, name: str, **params: Any) -> tuple[int, bool]:
        sql, args = self.queries.compile(name, params)
        count, _, _, reran = await self._run(sql, args, fetch=False)
        return count, reran

    async def fetchall(self, name: str, **params: Any) -> list[Row]:
        sql, args = self.queries.compile(name, params)
        _, rows, _, _ = await self._run(sql, args, fetch=True)
        return rows

    async def fetch_sql(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        _, rows, _, _ = await self._run(sql, args, fetch=True)
        return rows

    async def fetch_columns(self, sql: str, args: tuple[Any, ...]) -> tuple[list[str], list[Row]]:
        """A job's query (``ctx.sql``): never run again after a lost reply."""
        _, rows, names, _ = await self._run(sql, args, fetch=True, rerun=False)
        return names, rows

    async def execute_sql(self, sql: str, args: tuple[Any, ...]) -> int:
        """A job's statement (``ctx.db.execute``): never run again after a lost reply."""
        count, _, _, _ = await self._run(sql, args, fetch=False, rerun=False)
        return count

    async def clock_ms(self) -> int:
        """The server's clock in epoch milliseconds (the dialect's ``clock_ms`` query)."""
        return int(await self.fetchval("clock_ms"))

    async def threads_running(self) -> int | None:
        """Statements the server is executing now (the dialect's ``threads_running``)."""
        row = await self.fetchone("threads_running")
        return int(row[1]) if row else None

"""MySQL/MariaDB adapter over an aiomysql pool (one connection per concurrent statement)."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any
from urllib.parse import parse_qs, unquote

import aiomysql
import pymysql

from batchrun.db.base import Database, Row
from batchrun.db.ddl import NotOnlineError
from batchrun.db.sql import Queries, Statement
from batchrun.errors import (
    ConfigError,
    DatabaseError,
    LockTimeoutError,
    NotMigratedError,
    OutcomeUnknownError,
)
from batchrun.urls import mask_text, mask_url, split

log = logging.getLogger(__name__)

_NO_TABLE = 1146
_LOCK_WAIT_TIMEOUT = 1205
# Server gone away, lost connection: one of batchrun's own statements (idempotent by
# construction) goes again on a fresh connection; a job's statement never does (its
# outcome is unknown: OutcomeUnknownError, the entity is retried as a whole).
_LOST = {2006, 2013, 2055}
_LOST_TRIES = 3
# Deadlock, lock wait timeout: InnoDB rolled the statement back (autocommit, and
# innodb_rollback_on_timeout or not, a timed-out statement is undone), so it goes again.
_CONFLICT = {1213, _LOCK_WAIT_TIMEOUT}
_CONFLICT_TRIES = 3
# A batchrun statement waits at most this long for a row lock, then goes again (three tries
# in all): well under the 15 s lease, so a heartbeat or outcome write held up by another
# session's lock fails in time for the run to notice (the fence in pipeline/lease.py),
# instead of waiting 50 s while its claims expire.
LOCK_WAIT_S = 2
_UNKNOWN_VARIABLE = 1193
# The server refuses a stated ALGORITHM= or LOCK= (ER_ALTER_OPERATION_NOT_SUPPORTED and
# its _REASON variant): the change cannot be made online.
_NOT_ONLINE = {1845, 1846}
# Single autocommit statements need no snapshot: READ COMMITTED takes no gap locks, so
# concurrent runs and the heartbeat block each other less. MariaDB names the variable
# tx_isolation (transaction_isolation only from 11.1), MySQL 8 transaction_isolation.
_SESSION = (
    f"SET @@SESSION.{{var}} = 'READ-COMMITTED', @@SESSION.innodb_lock_wait_timeout = {LOCK_WAIT_S}"
)
_CONNECT = {2002, 2003, 1045, 1049, 2005}


class QuietCursor(aiomysql.Cursor):  # type: ignore[misc]
    """A cursor that does not fetch SHOW WARNINGS after a statement with warnings.

    INSERT IGNORE reports each duplicate as a warning; fetching them costs a round trip per
    page and turns them into Python warnings, and batchrun expects those duplicates.
    """

    async def _show_warnings(self, conn: Any) -> None:
        return None

    def _escape_args(self, args: Any, conn: Any) -> Any:
        """The driver's own escaping, with plain ints (page ids) turned to text directly.

        ``str(n)`` is what pymysql's ``escape_int`` returns; skipping its three calls per
        value matters on pages of a thousand ids. Everything else goes to the driver.
        """
        if isinstance(args, tuple):
            escape = conn.escape
            return tuple(str(arg) if type(arg) is int else escape(arg) for arg in args)
        return super()._escape_args(args, conn)


class MySQLDatabase(Database):
    """A pool of autocommit connections; never shares one connection between tasks."""

    dialect = "mysql"

    def __init__(self, url: str, queries: Queries, pool: aiomysql.Pool) -> None:
        super().__init__(queries)
        self._raw_url = url
        self.url = mask_url(url)
        self._pool = pool

    @classmethod
    async def open(cls, url: str, queries: Queries, *, pool_size: int = 4) -> MySQLDatabase:
        """Connect a pool of up to ``pool_size`` connections to ``url``."""
        parts = split(url)
        database = parts.path.lstrip("/")
        if not database:
            raise ConfigError(f"database URL {mask_url(url)!r} names no database")
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigError(f"database URL {mask_url(url)!r} has a bad port") from None
        options = parse_qs(parts.query)
        try:
            timeout = float(options.get("connect_timeout", ["10"])[0])
        except ValueError:
            timeout = math.nan
        if not 0 < timeout < math.inf:
            raise ConfigError(
                f"database URL {mask_url(url)!r} has a bad connect_timeout "
                "(seconds, a number above 0)"
            )
        settings = {
            "host": parts.hostname or "127.0.0.1",
            "port": port,
            "user": unquote(parts.username or "root"),
            "password": unquote(parts.password or ""),
            "db": unquote(database),
            "autocommit": True,
            "charset": "utf8mb4",
            "minsize": 1,
            "maxsize": max(1, pool_size),
            "connect_timeout": timeout,
            "pool_recycle": 3600,
        }
        pool = None
        for var in ("tx_isolation", "transaction_isolation"):
            try:
                pool = await aiomysql.create_pool(**settings, init_command=_SESSION.format(var=var))
                break
            except (pymysql.err.MySQLError, OSError) as exc:
                if _code(exc) == _UNKNOWN_VARIABLE and var == "tx_isolation":
                    continue
                raise DatabaseError(
                    f"cannot connect to {mask_url(url)}: {mask_text(_describe(exc), url)}"
                ) from exc
        assert pool is not None
        return cls(url, queries, pool)

    async def _run(
        self, sql: str, args: tuple[Any, ...], *, fetch: bool, rerun: bool = True
    ) -> tuple[int, list[Row], list[str], bool]:
        """Run one statement: (rowcount, rows, column names, whether it went again after a
        lost connection). ``rerun``: batchrun's own statement, safe to run again after a
        lost reply; a job's statement is not (``OutcomeUnknownError``)."""
        lost = conflicts = 0
        while True:
            try:
                conn = await self._pool.acquire()
            except (pymysql.err.MySQLError, OSError) as exc:
                # Nothing was sent: any statement may go again on the next connection.
                lost = await self._after_lost(exc, lost, rerun=True)
                continue
            try:
                async with conn.cursor(QuietCursor) as cur:
                    await cur.execute(sql, args)
                    rows = list(await cur.fetchall()) if fetch else []
                    names = [d[0] for d in cur.description or ()]
                    return cur.rowcount, rows, names, lost > 0
            except pymysql.err.MySQLError as exc:
                code = _code(exc)
                if code in _LOST:
                    conn.close()
                    lost = await self._after_lost(exc, lost, rerun=rerun)
                    continue
                if code in _CONFLICT and conflicts < _CONFLICT_TRIES:
                    # The heartbeat and the outcome writes lock the same ledger rows in
                    # different index orders; InnoDB breaks the rare cycle by rolling one
                    # statement back, and that statement simply goes again.
                    conflicts += 1
                    await asyncio.sleep(random.uniform(0.01, 0.05) * conflicts)
                    continue
                raise self._convert(exc) from exc
            except OSError as exc:
                conn.close()
                lost = await self._after_lost(exc, lost, rerun=rerun)
                continue
            finally:
                await self._pool.release(conn)

    async def _after_lost(self, exc: BaseException, lost: int, *, rerun: bool) -> int:
        """After a lost connection: how many so far, once it is safe and worth going again;
        else the error to raise."""
        text = mask_text(_describe(exc), self._raw_url)
        if not rerun:
            raise OutcomeUnknownError(
                f"database {self.url}: the connection was lost before the statement's reply "
                f"({text}): its outcome is unknown"
            ) from exc
        if lost >= _LOST_TRIES:
            raise DatabaseError(f"database {self.url}: {text}") from exc
        log.warning("database connection lost (%s); trying again", text)
        await asyncio.sleep(random.uniform(0.05, 0.15) * 2**lost)
        return lost + 1

    def _convert(self, exc: pymysql.err.MySQLError) -> DatabaseError:
        text = mask_text(_describe(exc), self._raw_url)
        if _code(exc) == _NO_TABLE:
            return NotMigratedError(
                f"database {self.url} is missing batchrun's tables ({text}): "
                "run `batchrun db migrate`"
            )
        if _code(exc) in _CONFLICT:
            return LockTimeoutError(f"database {self.url}: {text}")
        if _code(exc) in _NOT_ONLINE:
            return NotOnlineError(text)
        return DatabaseError(f"database {self.url}: {text}")

    async def execute(self, name: str, **params: Any) -> int:
        sql, args = self.queries.compile(name, params)
        count, _, _, _ = await self._run(sql, args, fetch=False)
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
        _, rows, names, _ = await self._run(sql, args, fetch=True, rerun=False)
        return names, rows

    async def execute_sql(self, sql: str, args: tuple[Any, ...]) -> int:
        count, _, _, _ = await self._run(sql, args, fetch=False, rerun=False)
        return count

    async def run_step(self, statement: Statement) -> None:
        sql, args = self.queries.compile_text(statement.text, statement.text, {})
        await self._run(sql, args, fetch=False)

    async def clock_ms(self) -> int:
        """The server's clock (UTC_TIMESTAMP(6), NOW(6) in UTC) in epoch milliseconds."""
        return int(await self.fetchval("clock_ms"))

    async def estimate_rows(self, table: str) -> int | None:
        """InnoDB's own estimate (information_schema TABLES.TABLE_ROWS): no table scan."""
        if not await self.has_table(table):
            return None
        rows = await self.fetchval("table_rows", table=table)
        return None if rows is None else int(rows)

    async def threads_running(self) -> int | None:
        """The server's Threads_running (SHOW GLOBAL STATUS): statements executing now."""
        row = await self.fetchone("threads_running")
        return int(row[1]) if row else None

    async def close(self) -> None:
        self._pool.close()
        await self._pool.wait_closed()


def _code(exc: BaseException) -> int | None:
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    return args[0] if args and isinstance(args[0], int) else None


def _describe(exc: BaseException) -> str:
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if len(args) >= 2 and isinstance(args[0], int):
        return f"({args[0]}) {args[1]}"
    return str(exc) or type(exc).__name__

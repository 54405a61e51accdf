"""MySQL/MariaDB adapter over an aiomysql pool (one connection per concurrent statement)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from typing import Any
from urllib.parse import parse_qs, unquote

import aiomysql
import pymysql

from batchrun.db.base import Row
from batchrun.db.ddl import NotOnlineError
from batchrun.db.server import CONFLICT_TRIES, ReplyDeadline, ServerDatabase, reply_timeout
from batchrun.db.sql import Queries, Statement
from batchrun.errors import (
    ConfigError,
    DatabaseError,
    LockTimeoutError,
    NotMigratedError,
    StatementError,
)
from batchrun.urls import mask_text, mask_url, split

log = logging.getLogger(__name__)

_NO_TABLE = 1146
# A statement refused as written: a syntax error, no such table, no such column.
_AS_WRITTEN = {1064, _NO_TABLE, 1054}
_LOCK_WAIT_TIMEOUT = 1205
# Server gone away, lost connection: one of batchrun's own statements (idempotent by
# construction) goes again on a fresh connection; a job's statement never does (its
# outcome is unknown: OutcomeUnknownError, the entity is retried as a whole).
_LOST = {2006, 2013, 2055}
# Deadlock, lock wait timeout: InnoDB rolled the statement back (autocommit, and
# innodb_rollback_on_timeout or not, a timed-out statement is undone), so it goes again.
_CONFLICT = {1213, _LOCK_WAIT_TIMEOUT}
# The server's statement time limit (MariaDB's max_statement_time, MySQL's
# max_execution_time), when shorter than the lock wait: the statement was undone as well.
# batchrun's own goes again as for a conflict; a job's is its error.
# KILL QUERY (1317, "Query execution was interrupted") undoes the statement alike; a
# DBA's kill of one statement should not end a run and leave its emails unrecorded.
_TIMED_OUT = {1969, 3024, 1317}
# A batchrun statement waits at most this long for a row lock, then goes again (three tries
# in all): well under the 15 s lease, so a heartbeat or outcome write held up by another
# session's lock fails in time for the run to notice (the fence in pipeline/lease.py),
# instead of waiting 50 s while its claims expire.
LOCK_WAIT_S = 2
_UNKNOWN_VARIABLE = 1193
KILL_TIMEOUT_S = 5.0  # the most a cancelled statement's KILL QUERY may take
# The server refuses a stated ALGORITHM= or LOCK= (ER_ALTER_OPERATION_NOT_SUPPORTED and
# its _REASON variant): the change cannot be made online.
_NOT_ONLINE = {1845, 1846}
# Single autocommit statements need no snapshot: READ COMMITTED takes no gap locks, so
# concurrent runs and the heartbeat block each other less. MariaDB names the variable
# tx_isolation (transaction_isolation only from 11.1), MySQL 8 transaction_isolation.
# lock_wait_timeout bounds a wait for a table's metadata lock (the server's default is a
# day): an ALTER of `db migrate` behind another session's open transaction made every
# statement of the application on that table queue behind it meanwhile; now it gives up
# after LOCK_WAIT_S (1205, a conflict: tried again, then one line).
_SESSION = (
    f"SET @@SESSION.{{var}} = 'READ-COMMITTED', @@SESSION.innodb_lock_wait_timeout = {LOCK_WAIT_S}"
    f", @@SESSION.lock_wait_timeout = {LOCK_WAIT_S}"
)
_CONNECT = {2002, 2003, 1045, 1049, 2005}


_NO_BACKSLASH_ESCAPES = pymysql.constants.SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
# What pymysql's escape_string replaces in a text, and with what.
_ESCAPES = str.maketrans(
    {"\0": "\\0", "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\032": "\\Z", '"': '\\"', "'": "\\'"}
)
# Whether a text holds one of those characters. Most texts (addresses, keys, codes) hold
# none, and a search is a sixth of what ``translate`` with a table costs on them.
_TO_ESCAPE = re.compile(r"[\x00\\\n\r\x1a\"']")


class QuietCursor(aiomysql.Cursor):  # type: ignore[misc]
    """A cursor that does not fetch SHOW WARNINGS after a statement with warnings.

    INSERT IGNORE reports each duplicate as a warning; fetching them costs a round trip per
    page and turns them into Python warnings, and batchrun expects those duplicates.
    """

    async def _show_warnings(self, conn: Any) -> None:
        return None

    def _escape_args(self, args: Any, conn: Any) -> Any:
        """The driver's own escaping, with plain ints and texts done directly, once each.

        ``str(n)`` is what pymysql's ``escape_int`` returns, and a text is quoted as it is
        when it holds nothing to escape, else translated by the table pymysql's
        ``escape_string`` uses (unless the session has NO_BACKSLASH_ESCAPES, where quotes
        are doubled instead). A multi-row insert
        repeats the same job, period and owner on every row: each distinct int or text
        is escaped once per statement. Skipping the driver's three calls per value, and
        the repeats, matters on pages of a thousand ids and of ledger rows. Everything
        else goes to the driver.
        """
        if isinstance(args, tuple):
            escape = conn.escape
            if conn.server_status & _NO_BACKSLASH_ESCAPES:
                return tuple(str(arg) if type(arg) is int else escape(arg) for arg in args)
            done: dict[int | str, str] = {}  # ints and texts never compare equal
            out = []
            for arg in args:
                kind = type(arg)
                if kind is int or kind is str:
                    text = done.get(arg)
                    if text is None:
                        if kind is int:
                            text = str(arg)
                        elif _TO_ESCAPE.search(arg) is None:
                            text = "'" + arg + "'"
                        else:
                            text = "'" + arg.translate(_ESCAPES) + "'"
                        done[arg] = text
                else:
                    text = escape(arg)
                out.append(text)
            return tuple(out)
        return super()._escape_args(args, conn)


class MySQLDatabase(ServerDatabase):
    """A pool of autocommit connections; never shares one connection between tasks. The
    clock is the server's ``UTC_TIMESTAMP(6)``."""

    dialect = "mysql"

    def __init__(self, url: str, queries: Queries, pool: aiomysql.Pool) -> None:
        super().__init__(url, queries)
        self._pool = pool

    @classmethod
    async def open(cls, url: str, queries: Queries, *, pool_size: int = 4) -> MySQLDatabase:
        """Connect a pool of up to ``pool_size`` connections to ``url``."""
        parts = split(url)
        # aiomysql's connect_timeout covers the TCP connect only: a server (or a proxy in
        # front of it) that accepts and then says nothing held the login for good.
        login_s = reply_timeout(url)  # a bad one refused before connecting
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
                async with asyncio.timeout(login_s):
                    pool = await aiomysql.create_pool(
                        **settings, init_command=_SESSION.format(var=var)
                    )
                break
            except TimeoutError as exc:
                raise DatabaseError(
                    f"cannot connect to {mask_url(url)}: no answer in {login_s:g} s "
                    "(the URL's reply_timeout)"
                ) from exc
            except (pymysql.err.MySQLError, OSError) as exc:
                if _code(exc) == _UNKNOWN_VARIABLE and var == "tx_isolation":
                    continue
                raise DatabaseError(
                    f"cannot connect to {mask_url(url)}: {mask_text(_describe(exc), url)}"
                ) from exc
        assert pool is not None
        return cls(url, queries, pool)

    async def _run(
        self,
        sql: str,
        args: tuple[Any, ...],
        *,
        fetch: bool,
        rerun: bool = True,
        timeouts: bool = True,
        deadline: bool = True,
    ) -> tuple[int, list[Row], list[str], bool]:
        lost = conflicts = 0
        while True:
            try:
                # A new connection's login is made while the pool is locked: one that gets
                # no answer held every statement of the process.
                async with asyncio.timeout(self.reply_timeout_s if deadline else None):
                    conn = await self._pool.acquire()
            except TimeoutError:
                silent = TimeoutError(
                    f"no connection in {self.reply_timeout_s:g} s (the URL's reply_timeout)"
                )
                lost = await self._after_lost(silent, lost, rerun=True)  # nothing was sent
                continue
            except (pymysql.err.MySQLError, OSError) as exc:
                # Nothing was sent: any statement may go again on the next connection.
                lost = await self._after_lost(exc, lost, rerun=True)
                continue
            silence = ReplyDeadline(
                self.reply_timeout_s if deadline else None, functools.partial(_abort, conn)
            )
            try:
                async with conn.cursor(QuietCursor) as cur:
                    await cur.execute(sql, args)
                    rows = list(await cur.fetchall()) if fetch else []
                    names = [d[0] for d in cur.description or ()]
                    return cur.rowcount, rows, names, lost > 0
            except pymysql.err.MySQLError as exc:
                code = _code(exc)
                if code in _LOST or silence.expired:
                    lost = await self._give_up(conn, silence, exc, lost, rerun=rerun)
                    continue
                timed_out = rerun and timeouts and code in _TIMED_OUT
                if (code in _CONFLICT or timed_out) and conflicts < CONFLICT_TRIES:
                    # The heartbeat and the outcome writes lock the same ledger rows in
                    # different index orders; InnoDB breaks the rare cycle by rolling one
                    # statement back, and that statement simply goes again.
                    conflicts = await self._after_conflict(conflicts)
                    continue
                raise self._convert(exc, own=rerun, timeouts=timeouts) from exc
            except Exception as exc:
                # A lost socket (OSError), or the driver tripping over the connection the
                # deadline closed under it (its reader gone: AttributeError).
                if not isinstance(exc, OSError) and not silence.expired:
                    raise
                lost = await self._give_up(conn, silence, exc, lost, rerun=rerun)
                continue
            except asyncio.CancelledError:
                # Ctrl-C, an abort: the server would go on with the statement (a migration's
                # ALTER for minutes, after `db migrate` said it stopped). asyncpg cancels its
                # own; here the statement is killed from another connection.
                conn.close()
                await self._kill_query(conn.thread_id())
                raise
            finally:
                silence.cancel()
                await self._pool.release(conn)

    async def _give_up(
        self,
        conn: aiomysql.Connection,
        silence: ReplyDeadline,
        exc: Exception,
        lost: int,
        *,
        rerun: bool,
    ) -> int:
        """A connection lost, or silent past the deadline: closed, its statement killed on
        the server if it may still run there; then what ``_after_lost`` says (the count)."""
        conn.close()
        if silence.expired:  # the server may still be at it: stop it there too
            await self._kill_query(conn.thread_id())
        return await self._after_lost(silence.explained(exc), lost, rerun=rerun)

    async def _kill_query(self, thread_id: int) -> None:
        """``KILL QUERY`` the statement a connection given up on still runs (a few seconds
        at most; an error is only logged: the statement may have ended already)."""
        try:
            async with asyncio.timeout(KILL_TIMEOUT_S):
                conn = await self._pool.acquire()
                try:
                    sql, args = self.queries.compile("kill_query", {"thread": int(thread_id)})
                    async with conn.cursor() as cur:
                        await cur.execute(sql, args)
                finally:
                    await self._pool.release(conn)
        except Exception as exc:  # a pool closing, the server gone: the cancel goes on
            log.debug("statement of connection %s not killed: %s", thread_id, exc)

    @staticmethod
    def _describe(exc: BaseException) -> str:
        return _describe(exc)

    def _convert(
        self, exc: pymysql.err.MySQLError, *, own: bool = True, timeouts: bool = True
    ) -> DatabaseError:
        """The error to raise for ``exc``; ``own``: one of batchrun's statements, whose
        missing table means a database not migrated (a job's is the job's mistake)."""
        text = self._masked(exc)
        if not own and _code(exc) in _AS_WRITTEN:
            return StatementError(f"database {self.url}: {text}")
        if own and _code(exc) == _NO_TABLE:
            return NotMigratedError(
                f"database {self.url} is missing batchrun's tables ({text}): "
                "run `batchrun db migrate`"
            )
        if _code(exc) in _CONFLICT or (own and timeouts and _code(exc) in _TIMED_OUT):
            return LockTimeoutError(f"database {self.url}: {text}")
        if _code(exc) in _NOT_ONLINE:
            return NotOnlineError(text)
        return DatabaseError(f"database {self.url}: {text}")

    async def run_step(self, statement: Statement) -> None:
        sql, args = self.queries.compile_text(statement.text, statement.text, {})
        # Cut short (a KILL, a lost connection, the statement time limit): never issued
        # again, as a DBA who killed a long ALTER meant it; and it may take long (a table
        # copy): no reply deadline.
        await self._run(sql, args, fetch=False, rerun=False, timeouts=False, deadline=False)

    async def estimate_rows(self, table: str) -> int | None:
        """InnoDB's own estimate (information_schema TABLES.TABLE_ROWS): no table scan."""
        if not await self.has_table(table):
            return None
        rows = await self.fetchval("table_rows", table=table)
        return None if rows is None else int(rows)

    async def close(self) -> None:
        self._pool.close()
        await self._pool.wait_closed()


def _abort(conn: aiomysql.Connection) -> None:
    """Drop a connection at once: ``close`` would first wait for unsent bytes to drain,
    which a silent network never lets happen."""
    writer = conn._writer
    if writer is not None:
        writer.transport.abort()
    conn.close()


def _code(exc: BaseException) -> int | None:
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    return args[0] if args and isinstance(args[0], int) else None


def _describe(exc: BaseException) -> str:
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if len(args) >= 2 and isinstance(args[0], int):
        return f"({args[0]}) {args[1]}"
    return str(exc) or type(exc).__name__

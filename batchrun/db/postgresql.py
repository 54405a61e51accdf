"""PostgreSQL adapter over an asyncpg pool (one connection per concurrent statement)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Callable
from datetime import date, datetime
from typing import Any
from urllib.parse import parse_qs, unquote

import asyncpg

from batchrun.db.base import Row
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

# "cannot switch to state N": asyncpg's protocol after its backend was terminated mid-call.
_InternalClientError = asyncpg.exceptions.InternalClientError

_NO_TABLE = "42P01"
_NO_DATABASE = "3D000"
_LOCK_NOT_AVAILABLE = "55P03"
# Deadlock, serialization failure, lock_timeout: the server rolled the statement back, so
# it goes again.
_CONFLICT = {"40P01", "40001", _LOCK_NOT_AVAILABLE}
# A statement_timeout of the database's own setting, shorter than the lock wait: rolled
# back as well (a cancel someone asked for is not taken for one: see _timed_out).
# batchrun's own statement goes again as for a conflict (an outcome write given up would
# leave emails sent and not recorded); a job's is its error, and a migration step's.
_CANCELED = "57014"


def _timed_out(exc: asyncpg.PostgresError) -> bool:
    """A statement_timeout, not a cancel someone asked for (``pg_cancel_backend``, whose
    57014 says "user request")."""
    return exc.sqlstate == _CANCELED and "statement timeout" in str(exc)


STEP_TRIES = 3  # a migration step that rebuilds an index, on a lock wait: in all
# A lost connection (a terminated backend, a dropped socket, asyncpg's protocol left in a
# state it cannot leave): batchrun's own statement goes again on a fresh connection, as on
# MySQL; a job's statement never does (db/server.py).
# As on MariaDB (see batchrun/db/mysql.py): a batchrun statement waits at most this long for
# a row lock, then goes again (three tries in all), well under the 15 s lease, so a blocked
# heartbeat or outcome write fails in time for the fence in pipeline/lease.py to notice.
LOCK_WAIT_S = 2
# One statement of a migration step per line ending in ';' (a step may drop an INVALID index
# left by an interrupted CREATE INDEX CONCURRENTLY before building it again).
_STATEMENT_END = re.compile(r";[ \t]*\n")
_DROP_INDEX = re.compile(r"\s*DROP INDEX CONCURRENTLY IF EXISTS ", re.IGNORECASE)
# New ledger rows after which the ledger's statistics are refreshed (then at twice as many).
_ANALYZE_FIRST = 1000
# asyncpg caches a prepared statement of at most 15 KB by default: a page's multi-row
# insert (38 KB for 500 ledger rows) was prepared again on every page, with every one
# of its parameters. A few such texts a run: cached, at most 100 a connection.
MAX_CACHED_STATEMENT = 128 * 1024


def _encode_date(value: Any) -> str:
    return value if isinstance(value, str) else value.isoformat()


def _encode_timestamp(value: Any) -> str:
    return value if isinstance(value, str) else value.isoformat(sep=" ")


# Dates and timestamps cross as text, so a job may bind '2025-06-01' as MySQL and SQLite
# let it (asyncpg's own codecs take only date and datetime objects); rows still read back
# as date and datetime.
_CODECS: tuple[tuple[str, Callable[[Any], str], Callable[[str], Any]], ...] = (
    ("date", _encode_date, date.fromisoformat),
    ("timestamp", _encode_timestamp, datetime.fromisoformat),
    ("timestamptz", _encode_timestamp, datetime.fromisoformat),
)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name, encoder, decoder in _CODECS:
        await conn.set_type_codec(
            name, schema="pg_catalog", encoder=encoder, decoder=decoder, format="text"
        )


def connection_options(url: str) -> dict[str, Any]:
    """asyncpg's connect arguments for ``postgresql://user:pass@host:port/db?...``."""
    parts = split(url)
    reply_timeout(url)  # a bad one refused before connecting
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigError(f"database URL {mask_url(url)!r} names no database")
    try:
        port = parts.port or 5432
    except ValueError:
        raise ConfigError(f"database URL {mask_url(url)!r} has a bad port") from None
    options = parse_qs(parts.query)
    try:
        timeout = float(options.get("connect_timeout", ["10"])[0])
    except ValueError:
        raise ConfigError(f"database URL {mask_url(url)!r} has a bad connect_timeout") from None
    settings: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "user": unquote(parts.username or "postgres"),
        "password": unquote(parts.password or "") or None,
        "database": database,
        "timeout": timeout,
        "max_cacheable_statement_size": MAX_CACHED_STATEMENT,
        "server_settings": {"lock_timeout": f"{LOCK_WAIT_S}s", "application_name": "batchrun"},
    }
    if "sslmode" in options:
        settings["ssl"] = options["sslmode"][0]
    return settings


class PostgreSQLDatabase(ServerDatabase):
    """A pool of connections in autocommit; never shares one connection between tasks. The
    clock is the server's ``clock_timestamp()``."""

    dialect = "postgresql"

    def __init__(self, url: str, queries: Queries, pool: asyncpg.Pool) -> None:
        super().__init__(url, queries)
        self._pool = pool
        self._claimed = 0
        self._analyze_at = _ANALYZE_FIRST

    @classmethod
    async def open(
        cls, url: str, queries: Queries, *, pool_size: int = 4, create: bool = False
    ) -> PostgreSQLDatabase:
        """Connect a pool of up to ``pool_size`` connections; ``create`` creates a missing
        database first (``batchrun db migrate``)."""
        settings = connection_options(url)
        size = max(1, pool_size)
        for attempt in (1, 2):
            try:
                pool = await asyncpg.create_pool(
                    min_size=1, max_size=size, init=_init_connection, **settings
                )
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
                if create and attempt == 1 and getattr(exc, "sqlstate", None) == _NO_DATABASE:
                    await _create_database(url, settings)
                    continue
                raise DatabaseError(
                    f"cannot connect to {mask_url(url)}: {mask_text(_describe(exc), url)}"
                ) from exc
            assert pool is not None
            return cls(url, queries, pool)
        raise AssertionError("unreachable")

    async def _run(
        self,
        sql: str,
        args: tuple[Any, ...],
        *,
        fetch: bool,
        rerun: bool = True,
        conflict_tries: int = CONFLICT_TRIES,
        timeouts: bool = True,
        deadline: bool = True,
    ) -> tuple[int, list[Row], list[str], bool]:
        lost = conflicts = 0
        while True:
            try:
                conn = await self._pool.acquire()
            except (asyncpg.PostgresError, asyncpg.InterfaceError, _InternalClientError) as exc:
                if isinstance(exc, asyncpg.PostgresError) and not _is_lost(exc.sqlstate or ""):
                    raise self._convert(exc) from exc
                lost = await self._after_lost(exc, lost, rerun=True)  # nothing was sent
                continue
            except OSError as exc:
                lost = await self._after_lost(exc, lost, rerun=True)
                continue
            silence = ReplyDeadline(
                self.reply_timeout_s if deadline else None, functools.partial(_discard, conn)
            )
            try:
                if fetch:
                    records = await conn.fetch(sql, *args)
                    names = list(records[0].keys()) if records else []
                    return len(records), [tuple(r) for r in records], names, lost > 0
                status = await conn.execute(sql, *args)
                return _rowcount(status), [], [], lost > 0
            except asyncpg.PostgresError as exc:
                code = exc.sqlstate or ""
                if _is_lost(code) or silence.expired:
                    _discard(conn)
                    lost = await self._after_lost(silence.explained(exc), lost, rerun=rerun)
                    continue
                timed_out = rerun and timeouts and _timed_out(exc)
                if (code in _CONFLICT or timed_out) and conflicts < conflict_tries:
                    conflicts = await self._after_conflict(conflicts)
                    continue
                raise self._convert(exc, own=rerun, timeouts=timeouts) from exc
            except (asyncpg.InterfaceError, _InternalClientError, OSError) as exc:
                if not _client_lost(exc) and not silence.expired:
                    raise DatabaseError(f"database {self.url}: {self._masked(exc)}") from exc
                _discard(conn)  # never back into the pool in a state it cannot leave
                lost = await self._after_lost(silence.explained(exc), lost, rerun=rerun)
                continue
            except Exception as exc:
                if not silence.expired:
                    raise
                # asyncpg tripping over the connection the deadline terminated under it
                # (its protocol gone between prepare and execute: AttributeError)
                lost = await self._after_lost(silence.explained(exc), lost, rerun=rerun)
                continue
            finally:
                silence.cancel()
                with contextlib.suppress(Exception):
                    await self._pool.release(conn)

    @staticmethod
    def _describe(exc: BaseException) -> str:
        return _describe(exc)

    def _convert(
        self, exc: asyncpg.PostgresError, *, own: bool = True, timeouts: bool = True
    ) -> DatabaseError:
        """The error to raise for ``exc``; ``own``: one of batchrun's statements, whose
        missing table means a database not migrated (a job's is the job's mistake)."""
        text = self._masked(exc)
        if not own and (exc.sqlstate or "").startswith("42"):  # syntax, no such table ...
            return StatementError(f"database {self.url}: {text}")
        if own and exc.sqlstate == _NO_TABLE:
            return NotMigratedError(
                f"database {self.url} is missing batchrun's tables ({text}): "
                "run `batchrun db migrate`"
            )
        if exc.sqlstate in _CONFLICT or (own and timeouts and _timed_out(exc)):
            return LockTimeoutError(f"database {self.url}: {text}")
        return DatabaseError(f"database {self.url}: {text}")

    async def execute_reran(self, name: str, **params: Any) -> tuple[int, bool]:
        sql, args = self.queries.compile(name, params)
        count, _, _, reran = await self._run(sql, args, fetch=False)
        if name == "claim_new" and count:
            self._claimed += count
            if self._claimed >= self._analyze_at:
                self._analyze_at = 2 * self._claimed
                await self._refresh_ledger_statistics()
        return count, reran

    async def _refresh_ledger_statistics(self) -> None:
        """ANALYZE the ledger (see ``analyze_ledger``); a failure only costs a slower plan."""
        try:
            await self._run(self.queries.statements["analyze_ledger"].text, (), fetch=False)
        except DatabaseError as exc:
            log.debug("ledger statistics not refreshed: %s", exc)

    async def run_step(self, statement: Statement) -> None:
        """Each statement of the step alone, outside any transaction (``CREATE INDEX
        CONCURRENTLY`` refuses to run inside one).

        A step that opens with ``DROP INDEX CONCURRENTLY IF EXISTS`` runs it again when a
        later statement fails: a failed concurrent build (duplicate keys, a lock timeout)
        leaves an INVALID index that writes would still maintain, and a failed unique one
        would still refuse duplicates. Such a step goes again whole after a lock wait;
        after a lost connection (``pg_terminate_backend``, a network fault) no step does:
        someone may have stopped it on purpose, and ``db migrate`` again finishes it.
        """
        parts = [p for p in _STATEMENT_END.split(statement.text + "\n") if p.strip()]
        rebuilds = _DROP_INDEX.match(parts[0]) is not None
        for attempt in range(1, STEP_TRIES + 1):
            try:
                for i, part in enumerate(parts):
                    try:
                        await self._step_statement(part)
                    except DatabaseError:
                        if i > 0 and rebuilds:
                            with contextlib.suppress(DatabaseError):
                                await self._run(parts[0], (), fetch=False, deadline=False)
                        raise
                return
            except LockTimeoutError:
                if not rebuilds or attempt == STEP_TRIES:
                    raise
                # The whole step again (the INVALID index dropped first), after a pause.
                await asyncio.sleep(0.5 * attempt)

    async def _step_statement(self, sql: str) -> None:
        """One statement of a migration step. None goes again after a lost connection,
        the database's statement time limit or a cancel. A concurrent build does not
        after a lock wait either: one cut short leaves an INVALID index, which ``IF NOT
        EXISTS`` would take as built (a step that opens with ``DROP INDEX CONCURRENTLY IF
        EXISTS`` goes again whole, in ``run_step``)."""
        if "CONCURRENTLY" in sql.upper():
            await self._run(sql, (), fetch=False, rerun=False, conflict_tries=0, deadline=False)
        else:
            await self._run(sql, (), fetch=False, rerun=False, timeouts=False, deadline=False)

    async def estimate_rows(self, table: str) -> int | None:
        """The planner's estimate (pg_class.reltuples): no table scan; None before the
        table's first VACUUM or ANALYZE."""
        if not await self.has_table(table):
            return None
        rows = await self.fetchval("table_rows", table=table)
        return None if rows is None or int(rows) < 0 else int(rows)

    async def close(self) -> None:
        await self._pool.close()


async def _create_database(url: str, settings: dict[str, Any]) -> None:
    """CREATE DATABASE for ``settings['database']``, connected to the ``postgres`` one."""
    name = str(settings["database"])
    admin = {**settings, "database": "postgres"}
    try:
        conn = await asyncpg.connect(**admin)
        try:
            await conn.execute(f'CREATE DATABASE "{name.replace(chr(34), chr(34) * 2)}"')
        finally:
            await conn.close()
    except asyncpg.DuplicateDatabaseError:
        return  # another process created it meanwhile
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        raise DatabaseError(
            f"cannot create database {name!r} at {mask_url(url)}: {mask_text(_describe(exc), url)}"
        ) from exc


def _rowcount(status: str) -> int:
    """The row count at the end of a command tag (``INSERT 0 5``, ``UPDATE 3``), else 0."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


def _discard(conn: Any) -> None:
    """Close a connection whose socket or protocol state is lost (asyncpg may have let go
    of it already)."""
    with contextlib.suppress(Exception):
        conn.terminate()


def _client_lost(exc: BaseException) -> bool:
    """Whether asyncpg's own error means the connection is gone or unusable (not a bad
    argument, which is an InterfaceError too)."""
    if isinstance(exc, OSError | asyncpg.ConnectionDoesNotExistError | _InternalClientError):
        return True
    text = str(exc)
    return "connection is closed" in text or "another operation is in progress" in text


def _is_lost(code: str) -> bool:
    # 08: connection exceptions; 57P01-57P03: the server shut the session down.
    return code.startswith("08") or code in ("57P01", "57P02", "57P03")


def _describe(exc: BaseException) -> str:
    """One line: ``(SQLSTATE) message (detail)``."""
    code = getattr(exc, "sqlstate", None)
    if isinstance(exc, asyncpg.PostgresError):
        text = str(exc.args[0] if exc.args else "") or type(exc).__name__
        detail = getattr(exc, "detail", None)
        text = f"{text} ({detail})" if detail else text
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    return f"({code}) {text}" if code else text

"""SQLite adapter over one aiosqlite connection (its thread serializes every statement)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import aiosqlite

from batchrun.db.base import Database, Row
from batchrun.db.sql import Queries, Statement
from batchrun.errors import (
    ConfigError,
    DatabaseError,
    LockTimeoutError,
    NotMigratedError,
    StatementError,
)


def sqlite_path(url: str) -> str:
    """The file path of ``sqlite:///relative`` or ``sqlite:////absolute``."""
    _, _, rest = url.partition("://")
    if not rest.startswith("/") or rest == "/":
        raise ConfigError(f"SQLite URL {url!r} must look like sqlite:///path/to/file.db")
    return rest[1:]


class SQLiteDatabase(Database):
    """A single autocommit connection in WAL mode, with a busy timeout for other processes."""

    dialect = "sqlite"

    def __init__(self, url: str, queries: Queries, conn: aiosqlite.Connection) -> None:
        super().__init__(queries)
        self.url = url
        self._conn = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(
        cls, url: str, queries: Queries, *, create: bool = False, busy_timeout: float = 5.0
    ) -> SQLiteDatabase:
        """Open the file; a missing file is an error unless ``create`` (migrations).

        Only ``create`` (``batchrun db migrate``) turns WAL on: SQLite keeps that in the
        file, so every later open runs in WAL, and an open that only reads (a dry run,
        ``status``) leaves the file's bytes as they were. ``busy_timeout`` is how many
        seconds a statement waits for another connection's lock before failing.
        """
        path = sqlite_path(url)
        # A plain stat, before the connection thread exists: not worth a thread hop.
        if not create and path != ":memory:" and not Path(path).exists():  # noqa: ASYNC240
            raise NotMigratedError(
                f"database file {path} does not exist: run `batchrun db migrate` first"
            )
        pragmas = ("pragma_wal", "pragma_synchronous") if create else ("pragma_synchronous",)
        try:
            # sqlite3's timeout is SQLite's busy timeout (sqlite3_busy_timeout).
            conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout)
            for name in pragmas:
                await conn.execute(queries.statements[name].text)
        except (sqlite3.Error, OSError) as exc:
            raise DatabaseError(f"cannot open SQLite database {path}: {exc}") from exc
        return cls(url, queries, conn)

    async def _run(self, sql: str, args: tuple[Any, ...], *, fetch: bool) -> tuple[int, list[Row]]:
        count, rows, _ = await self._run_described(sql, args, fetch=fetch)
        return count, rows

    async def _run_described(
        self, sql: str, args: tuple[Any, ...], *, fetch: bool, own: bool = True
    ) -> tuple[int, list[Row], list[str]]:
        """Run one statement; ``own``: one of batchrun's, whose missing table or column
        means a database not migrated (in a job's statement it is the job's mistake)."""
        try:
            # One statement at a time, start to finish: a half-read SELECT keeps a read
            # snapshot open, and a write from another task on this connection inside it
            # would fail at once with SQLITE_BUSY_SNAPSHOT instead of waiting.
            async with self._lock, self._conn.execute(sql, args) as cur:
                rows = list(await cur.fetchall()) if fetch else []
                names = [d[0] for d in cur.description or ()]
                return cur.rowcount, [tuple(r) for r in rows], names
        except sqlite3.OperationalError as exc:
            if not own and any(w in str(exc) for w in ("no such ", "syntax error")):
                raise StatementError(f"database {self.url}: {exc}") from exc
            if own and ("no such table" in str(exc) or "no such column" in str(exc)):
                raise NotMigratedError(
                    f"database {self.url} is missing batchrun's tables ({exc}): "
                    "run `batchrun db migrate`"
                ) from exc
            if "database is locked" in str(exc) or "database table is locked" in str(exc):
                # Another connection's write transaction outlasted the busy timeout: a
                # lock wait, gone through again by those who go through MySQL's (1205).
                raise LockTimeoutError(f"database {self.url}: {exc}") from exc
            raise DatabaseError(f"database {self.url}: {exc}") from exc
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            raise DatabaseError(f"database {self.url}: {exc}") from exc

    async def execute(self, name: str, **params: Any) -> int:
        sql, args = self.queries.compile(name, params)
        count, _ = await self._run(sql, args, fetch=False)
        return count

    async def fetchall(self, name: str, **params: Any) -> list[Row]:
        sql, args = self.queries.compile(name, params)
        _, rows = await self._run(sql, args, fetch=True)
        return rows

    async def fetch_sql(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        _, rows = await self._run(sql, args, fetch=True)
        return rows

    async def fetch_columns(self, sql: str, args: tuple[Any, ...]) -> tuple[list[str], list[Row]]:
        _, rows, names = await self._run_described(sql, args, fetch=True, own=False)
        return names, rows

    async def execute_sql(self, sql: str, args: tuple[Any, ...]) -> int:
        count, _, _ = await self._run_described(sql, args, fetch=False, own=False)
        return count

    async def run_step(self, statement: Statement) -> None:
        await self._run(statement.text, (), fetch=False)

    async def estimate_rows(self, table: str) -> int | None:
        """ANALYZE's figure (sqlite_stat1) when there is one, else the rows dbstat counts
        (None when this SQLite has no dbstat)."""
        if not await self.has_table(table):
            return None
        if await self.has_table("sqlite_stat1"):
            stat = await self.fetchval("table_rows_stat", table=table)
            if stat:
                return int(str(stat).split()[0])
        try:
            count = await self.fetchval("table_rows_count", table=table)
        except DatabaseError:  # an SQLite built without the dbstat table
            return None
        return int(count or 0)

    async def close(self) -> None:
        await self._conn.close()

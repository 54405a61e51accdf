"""The Database adapter every dialect implements, and its choice by URL."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

from batchrun import schemes
from batchrun.db.sql import Queries, Statement, load
from batchrun.errors import ConfigError
from batchrun.urls import mask_url, scheme_of

Row = tuple[Any, ...]


def now_ms() -> int:
    """This host's wall clock in epoch milliseconds (leases use ``Database.clock_ms``)."""
    return int(time.time() * 1000)


_GUARDS = {
    "table": "has_table",
    "column": "has_column",
    "index": "has_index",
    "unique": "has_unique",
}


class Database(ABC):
    """Runs named queries; each call is one atomic statement in autocommit mode."""

    dialect: str
    url: str  # masked: safe to print

    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    @abstractmethod
    async def execute(self, name: str, **params: Any) -> int:
        """Run a statement; return the rows it changed."""

    async def execute_reran(self, name: str, **params: Any) -> tuple[int, bool]:
        """Run one of batchrun's statements; return the rows it changed, and whether it
        went again after a lost connection (its first run may have changed rows too)."""
        return await self.execute(name, **params), False

    async def clock_ms(self) -> int:
        """The database server's clock in epoch milliseconds: every lease is set and
        compared on it, one clock for every host (SQLite: this host's, the only one)."""
        return now_ms()

    @abstractmethod
    async def fetchall(self, name: str, **params: Any) -> list[Row]:
        """Run a query; return all its rows."""

    async def fetchone(self, name: str, **params: Any) -> Row | None:
        """Run a query; return its first row, or None."""
        rows = await self.fetchall(name, **params)
        return rows[0] if rows else None

    async def fetchval(self, name: str, **params: Any) -> Any:
        """Run a query; return the first column of its first row, or None."""
        row = await self.fetchone(name, **params)
        return row[0] if row else None

    @abstractmethod
    async def fetch_sql(self, sql: str, args: tuple[Any, ...]) -> list[Row]:
        """Run an already-compiled query (EXPLAIN of a named one)."""

    @abstractmethod
    async def fetch_columns(self, sql: str, args: tuple[Any, ...]) -> tuple[list[str], list[Row]]:
        """Run an already-compiled query; return its column names and rows (``ctx.db``).

        A job's statement: never run again after a lost connection (OutcomeUnknownError).
        """

    @abstractmethod
    async def execute_sql(self, sql: str, args: tuple[Any, ...]) -> int:
        """Run an already-compiled statement; return the rows it changed (``ctx.db``).

        A job's statement: never run again after a lost connection (OutcomeUnknownError).
        """

    @abstractmethod
    async def run_step(self, statement: Statement) -> None:
        """Run one migration step (DDL)."""

    async def guard_holds(self, guard: str) -> bool:
        """Whether a guard holds: ``table T``, ``missing T`` (no table T), ``column T.C``,
        ``index T.I`` or ``unique T.C``."""
        kind, _, target = guard.partition(" ")
        table, _, item = target.strip().partition(".")
        if kind == "missing":
            return not await self.has_table(table)
        query = _GUARDS.get(kind)
        if query is None:
            raise ValueError(f"unknown migration guard {guard!r}")
        return bool(await self.fetchval(query, table=table, item=item))

    async def has_table(self, table: str) -> bool:
        """Whether ``table`` exists."""
        return bool(await self.fetchval("has_table", table=table, item=""))

    async def estimate_rows(self, table: str) -> int | None:
        """About how many rows ``table`` holds (None: no such table, or no estimate)."""
        return None

    async def threads_running(self) -> int | None:
        """How many statements the server is executing now (None: no such server figure,
        as on SQLite): ``--max-db-load`` pauses while it is above its limit."""
        return None

    @abstractmethod
    async def close(self) -> None:
        """Close every connection."""


class JobDatabase:
    """``ctx.db``: SQL text with ``:name`` parameters, always bound by the driver.

    A list parameter expands for ``IN :ids`` (a list of tuples for multi-row ``VALUES``).
    Compiled statements are cached by their text, so a job's few queries are parsed once.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self.dialect = db.dialect

    async def fetch(self, sql: str, /, **params: Any) -> list[dict[str, Any]]:
        """Run a query; return its rows as dicts keyed by column name."""
        compiled, args = self._db.queries.compile_text(sql, sql, params)
        names, rows = await self._db.fetch_columns(compiled, args)
        return [dict(zip(names, row, strict=True)) for row in rows]

    async def execute(self, sql: str, /, **params: Any) -> int:
        """Run a statement; return the rows it changed."""
        compiled, args = self._db.queries.compile_text(sql, sql, params)
        return await self._db.execute_sql(compiled, args)


async def connect(
    url: str, *, pool_size: int = 4, create: bool = False, busy_timeout: float = 5.0
) -> Database:
    """Open the database at ``url``.

    Args:
        url: ``mysql://user:pass@host:port/db``, ``postgresql://user:pass@host:port/db``
            or ``sqlite:///path``.
        pool_size: most MySQL or PostgreSQL connections open at once.
        create: open to migrate: create a missing SQLite file and turn WAL on, or a
            missing PostgreSQL database.
        busy_timeout: seconds a SQLite statement waits for another process's lock.
    """
    found = schemes.find("db", url)
    if found is None:
        raise ConfigError(
            f"unknown database URL scheme {scheme_of(url) or '(none)'!r} in {mask_url(url)!r}: "
            f"use {schemes.forms('db')}"
        )
    if found.module == "batchrun.db.mysql":
        from batchrun.db.mysql import MySQLDatabase

        return await MySQLDatabase.open(url, load("mysql"), pool_size=pool_size)
    if found.module == "batchrun.db.postgresql":
        from batchrun.db.postgresql import PostgreSQLDatabase

        return await PostgreSQLDatabase.open(
            url, load("postgresql"), pool_size=pool_size, create=create
        )
    from batchrun.db.sqlite import SQLiteDatabase

    return await SQLiteDatabase.open(url, load("sqlite"), create=create, busy_timeout=busy_timeout)

"""Look into the test databases from outside batchrun: connections, inspection queries and
a digest of every row (tests only, synchronous)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pymysql

from batchrun.db.sqlite import sqlite_path

MYSQL_URL = os.environ.get("BATCHRUN_TEST_MYSQL_URL", "mysql://root:@127.0.0.1:3306/")
POSTGRES_URL = os.environ.get("BATCHRUN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/")


def mysql_connect(
    url: str | None = None, database: str | None = None
) -> pymysql.connections.Connection[Any]:
    """An autocommit pymysql connection to ``url`` (default: the test server, no database);
    ``database`` overrides the URL's own."""
    parts = urlsplit(url or MYSQL_URL)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database or parts.path.lstrip("/") or None,
        autocommit=True,
        connect_timeout=5,
        charset="utf8mb4",
    )


def pg_connect(url: str | None = None, database: str | None = None) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection to ``url`` (default: the test server's ``postgres``
    database); ``database`` overrides the URL's own."""
    parts = urlsplit(url or POSTGRES_URL)
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname=database or parts.path.lstrip("/") or "postgres",
        autocommit=True,
        connect_timeout=5,
    )


def table_digest(db_url: str, tables: list[str] | None = None) -> dict[str, str]:
    """A digest of every row of every table (not CHECKSUM TABLE: see DESIGN.md's traps)."""
    digests: dict[str, str] = {}
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            names = tables or [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"
                )
            ]
            for name in names:
                rows = conn.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall()
                digests[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
        finally:
            conn.close()
        return digests
    if db_url.startswith("postgres"):
        with pg_connect(db_url) as pg:
            names = tables or [
                str(r[0])
                for r in pg.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() ORDER BY table_name"
                ).fetchall()
            ]
            for name in names:
                rows = pg.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall()
                digests[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
        return digests
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            if tables is None:
                cur.execute("SHOW TABLES")
                tables = sorted(r[0] for r in cur.fetchall())
            for name in tables:
                cur.execute(f"SELECT * FROM `{name}` ORDER BY 1")
                digests[name] = hashlib.sha256(repr(cur.fetchall()).encode()).hexdigest()
    finally:
        conn.close()
    return digests


def query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run one inspection query synchronously (tests only)."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            rows = [tuple(r) for r in conn.execute(sql.replace("%s", "?"), args).fetchall()]
            conn.commit()
            return rows
        finally:
            conn.close()
    if db_url.startswith("postgres"):
        with pg_connect(db_url) as pg:
            cur = pg.execute(pg_sql(sql), args or None)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args or None)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


_PG_USER = re.compile(r"\b(FROM|JOIN|UPDATE|INTO|TABLE)\s+user\b", re.IGNORECASE)


def pg_sql(sql: str) -> str:
    """A test's MySQL-style inspection query for PostgreSQL: `quoted` names in double
    quotes, the ``user`` table quoted (a reserved word there), and ``birth_month`` the
    expression the index is built on (PostgreSQL has no such column: no table rewrite)."""
    sql = sql.replace("`", '"')
    sql = _PG_USER.sub(lambda m: f'{m[1]} "user"', sql)
    return re.sub(r"\bbirth_month\b", "EXTRACT(MONTH FROM date_of_birth)", sql)


@contextlib.contextmanager
def holding_a_transaction(url: str, table: str) -> Iterator[threading.Event]:
    """An application's transaction open on ``table`` (MariaDB or PostgreSQL), from another
    thread, for the block's duration (60 s at most); yields the event its end sets, so a
    test can tell whether the transaction was still open."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        if url.startswith("postgres"):
            with pg_connect(url) as pg:
                pg.execute("BEGIN")
                pg.execute(f"SELECT COUNT(*) FROM {table}")
                holding.set()
                release.wait(60)
                pg.execute("ROLLBACK")
            return
        conn = mysql_connect(url)
        try:
            conn.begin()
            with conn.cursor() as cur:
                cur.execute(f"SELECT COUNT(*) FROM {table}")
                cur.fetchall()
            holding.set()
            release.wait(60)
            conn.rollback()
        finally:
            conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10), f"no transaction could be opened on {table}"
        yield release
    finally:
        release.set()
        holder.join()

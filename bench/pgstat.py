"""PostgreSQL helpers for the benchmark: admin connection, the database's own counters.

Rows read are what the statistics collector counts for the bench database alone (no
pg_stat_statements needed): heap tuples read by sequential scans
(``pg_stat_user_tables.seq_tup_read``) plus index entries returned by index scans
(``pg_stat_user_indexes.idx_tup_read``), the counterpart of MariaDB's ``Handler_read_*``.
Round trips are the database's transactions (``xact_commit + xact_rollback``): batchrun
runs every statement alone in autocommit. A backend reports its counts when it ends, so
``counters`` first waits for the other sessions on the database to be gone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg

_COUNTERS = """
SELECT
  (SELECT COALESCE(SUM(seq_tup_read), 0) FROM pg_stat_user_tables)
  + (SELECT COALESCE(SUM(idx_tup_read), 0) FROM pg_stat_user_indexes),
  (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database())
"""
_OTHERS = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"


@dataclass(frozen=True)
class PgServer:
    """Where PostgreSQL is: ``postgresql://user:pass@host:port/`` without a database."""

    url: str

    def db_url(self, database: str) -> str:
        """The batchrun ``--db`` URL of ``database`` on this server."""
        return self.url.rstrip("/") + "/" + database

    @contextmanager
    def connect(self, database: str = "postgres") -> Iterator[psycopg.Connection[Any]]:
        """An autocommit admin connection."""
        parts = urlsplit(self.url)
        conn = psycopg.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or "") or None,
            dbname=database,
            autocommit=True,
            connect_timeout=5,
        )
        try:
            yield conn
        finally:
            conn.close()

    def reachable(self) -> str | None:
        """None when the server answers, else why not (one line)."""
        try:
            with self.connect():
                return None
        except psycopg.Error as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def query(conn: psycopg.Connection[Any], sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement; return its rows."""
    cur = conn.execute(sql, args)
    return [tuple(r) for r in cur.fetchall()] if cur.description else []


def counters(conn: psycopg.Connection[Any], database: str, wait_s: float = 10.0) -> dict[str, int]:
    """rows_read and transactions of ``database`` so far, once its other sessions ended."""
    deadline = time.monotonic() + wait_s
    while int(query(conn, _OTHERS, (database,))[0][0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    query(conn, "SELECT pg_stat_clear_snapshot()")
    rows, xacts = query(conn, _COUNTERS)[0]
    return {"rows_read": int(rows), "transactions": int(xacts)}


def reset_stats(conn: psycopg.Connection[Any]) -> None:
    """Zero the database's statistics (the counters then count one contender alone)."""
    query(conn, "SELECT pg_stat_reset()")

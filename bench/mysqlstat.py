"""MariaDB helpers for the benchmark: admin connection, global counters, CPU of processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

# Every row read through the handler interface, by index or by table scan.
HANDLER_READS = (
    "Handler_read_first",
    "Handler_read_key",
    "Handler_read_last",
    "Handler_read_next",
    "Handler_read_prev",
    "Handler_read_rnd",
    "Handler_read_rnd_next",
)
# One per statement a client sent; what a round trip costs the server.
STATEMENTS = ("Com_select", "Com_insert", "Com_update", "Com_delete", "Com_replace")
COUNTERS = (*HANDLER_READS, *STATEMENTS, "Questions")

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Server:
    """Where MariaDB is: ``mysql://user:pass@host:port/`` without a database."""

    url: str

    def db_url(self, database: str) -> str:
        """The batchrun ``--db`` URL of ``database`` on this server."""
        return self.url.rstrip("/") + "/" + database

    @contextmanager
    def connect(self, database: str | None = None) -> Iterator[pymysql.Connection[Any]]:
        """An autocommit admin connection."""
        parts = urlsplit(self.url)
        conn = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=database,
            autocommit=True,
            charset="utf8mb4",
            local_infile=True,
        )
        try:
            yield conn
        finally:
            conn.close()


def query(conn: pymysql.Connection[Any], sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement; return its rows."""
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def counters(conn: pymysql.Connection[Any]) -> dict[str, int]:
    """The global counters the benchmark reads (they include every session's work)."""
    names = ", ".join(f"'{name}'" for name in COUNTERS)
    rows = query(conn, f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
    return {str(name): int(value) for name, value in rows}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counter differences."""
    return {key: after[key] - before.get(key, 0) for key in after}


def rows_examined(d: dict[str, int]) -> int:
    """Sum of the Handler_read_* deltas."""
    return sum(d.get(name, 0) for name in HANDLER_READS)


def statements(d: dict[str, int]) -> int:
    """SELECT + INSERT + UPDATE + DELETE (+ REPLACE) statements."""
    return sum(d.get(name, 0) for name in STATEMENTS)


def server_pid(conn: pymysql.Connection[Any]) -> int | None:
    """mariadbd's process id, from its pid file (None when it cannot be read)."""
    try:
        path = str(query(conn, "SELECT @@pid_file")[0][0])
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError, IndexError):
        return None


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds a live process has used (None if unknown)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(p) for p in parts[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK

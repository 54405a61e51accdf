"""Opening a SQLite file only to read it leaves its bytes as they were.

``PRAGMA journal_mode = WAL`` rewrites the file's header, so only the migrate path (the
``create=True`` open of ``batchrun db migrate``) runs it; SQLite keeps the mode in the
file. The busy timeout is a parameter, 5 s by default: under the 15 s claim lease.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import pytest

from batchrun.db import connect
from batchrun.db.sql import load
from batchrun.db.sqlite import SQLiteDatabase, sqlite_path
from batchrun.errors import DatabaseError


@pytest.fixture
def delete_mode_url(sqlite_url: str) -> str:
    """A SQLite file written by plain sqlite3 in rollback-journal (DELETE) mode."""
    conn = sqlite3.connect(sqlite_path(sqlite_url))
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
        conn.execute("CREATE TABLE app_user (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        conn.executemany(
            "INSERT INTO app_user (name) VALUES (?)", [(f"user {i}",) for i in range(100)]
        )
        conn.commit()
    finally:
        conn.close()
    return sqlite_url


def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def journal_mode(path: str) -> str:
    conn = sqlite3.connect(path)
    try:
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        return str(mode)
    finally:
        conn.close()


async def test_an_open_that_only_reads_leaves_the_file_as_it_was(delete_mode_url: str) -> None:
    path = sqlite_path(delete_mode_url)
    before = sha256(path)
    files = sorted(p.name for p in Path(path).parent.iterdir())

    database = await SQLiteDatabase.open(delete_mode_url, load("sqlite"))
    try:
        rows = await database.fetch_sql("SELECT COUNT(*), MAX(name) FROM app_user", ())
    finally:
        await database.close()

    assert rows == [(100, "user 99")]
    assert sha256(path) == before
    assert journal_mode(path) == "delete"
    assert sorted(p.name for p in Path(path).parent.iterdir()) == files, "no -wal, -shm"


async def test_the_migrate_path_turns_wal_on_and_it_stays_on(delete_mode_url: str) -> None:
    path = sqlite_path(delete_mode_url)
    database = await connect(delete_mode_url, create=True)
    await database.close()
    assert journal_mode(path) == "wal"

    before = sha256(path)
    database = await connect(delete_mode_url)  # a later open keeps WAL without setting it
    try:
        assert await database.fetch_sql("PRAGMA journal_mode", ()) == [("wal",)]
        assert await database.fetch_sql("SELECT COUNT(*) FROM app_user", ()) == [(100,)]
    finally:
        await database.close()
    assert sha256(path) == before


async def test_a_new_file_is_created_in_wal_mode(sqlite_url: str) -> None:
    database = await connect(sqlite_url, create=True)
    await database.close()
    assert journal_mode(sqlite_path(sqlite_url)) == "wal"


async def test_the_busy_timeout_is_5_seconds_unless_given(delete_mode_url: str) -> None:
    for kwargs, expected in (({}, 5000), ({"busy_timeout": 1.5}, 1500)):
        database = await connect(delete_mode_url, **kwargs)
        try:
            assert await database.fetch_sql("PRAGMA busy_timeout", ()) == [(expected,)]
        finally:
            await database.close()


async def test_a_locked_file_fails_after_the_busy_timeout(delete_mode_url: str) -> None:
    """Another process's write lock: the read waits about ``busy_timeout``, then fails."""
    holder = sqlite3.connect(sqlite_path(delete_mode_url), isolation_level=None)
    database = await connect(delete_mode_url, busy_timeout=0.3)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="locked"):
            await database.fetch_sql("SELECT COUNT(*) FROM app_user", ())
        waited = time.monotonic() - started
        assert 0.25 <= waited < 3.0, waited
        holder.execute("ROLLBACK")
        assert await database.fetch_sql("SELECT COUNT(*) FROM app_user", ()) == [(100,)]
    finally:
        await database.close()
        holder.close()

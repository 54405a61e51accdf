"""`batchrun db migrate` against real MySQL/MariaDB and SQLite databases.

On an application database that already holds the seed's `user` and `gift_card` tables with
data, migrate only adds what batchrun needs and never changes a row; a second migrate changes
nothing at all; the page query uses `idx_user_birth_month_status_id`.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from datetime import date
from typing import Any

import pytest
from support.birthday import eligible_ids, seed_users
from support.checks import assert_one_card_each
from support.cli import run_cli
from support.db import mysql_connect, query, table_digest
from support.periods import month

from batchrun.db import Store, connect
from batchrun.errors import NotMigratedError
from batchrun.jobs.birthday import Birthday, demo
from batchrun.runtime import Options

BATCHRUN_TABLES = {
    "batchrun_schema",
    "batchrun_ledger",
    "batchrun_queue",
    "batchrun_suppression",
    "batchrun_run",
    "batchrun_control",
    "batchrun_entity_task",
    "batchrun_entity_turn",
    "batchrun_backend_slot",
}
USER_COLUMNS = "id, first_name, last_name, email, date_of_birth, status"
CARD_COLUMNS = "id, recipient_email, message, status, scheduled_at, gift_code"
INDEX = "idx_user_birth_month_status_id"

APP_SCHEMA = {
    # The application's own tables, in the seed's shape, as an app might have made them:
    # its own types and collation, not batchrun's.
    "mysql": [
        """CREATE TABLE `user` (
             id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
             first_name VARCHAR(100) NULL,
             last_name VARCHAR(100) NULL,
             email VARCHAR(191) NULL,
             date_of_birth DATE NULL,
             status TINYINT NOT NULL DEFAULT 10
           ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci""",
        """CREATE TABLE gift_card (
             id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
             recipient_email VARCHAR(191) NOT NULL,
             message VARCHAR(255) NOT NULL,
             status TINYINT NOT NULL DEFAULT 1,
             scheduled_at DATETIME NOT NULL,
             gift_code VARCHAR(32) NOT NULL
           ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci""",
    ],
    "postgresql": [
        """CREATE TABLE "user" (
             id SERIAL PRIMARY KEY,
             first_name VARCHAR(100) NULL,
             last_name VARCHAR(100) NULL,
             email VARCHAR(191) NULL,
             date_of_birth DATE NULL,
             status SMALLINT NOT NULL DEFAULT 10
           )""",
        """CREATE TABLE gift_card (
             id SERIAL PRIMARY KEY,
             recipient_email VARCHAR(191) NOT NULL,
             message VARCHAR(255) NOT NULL,
             status SMALLINT NOT NULL DEFAULT 1,
             scheduled_at TIMESTAMP NOT NULL,
             gift_code VARCHAR(32) NOT NULL
           )""",
    ],
    "sqlite": [
        """CREATE TABLE user (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             first_name TEXT,
             last_name TEXT,
             email TEXT,
             date_of_birth TEXT,
             status INTEGER NOT NULL DEFAULT 10
           )""",
        """CREATE TABLE gift_card (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             recipient_email TEXT NOT NULL,
             message TEXT NOT NULL,
             status INTEGER NOT NULL DEFAULT 1,
             scheduled_at TEXT NOT NULL,
             gift_code TEXT NOT NULL
           )""",
    ],
}


def dialect_of(db_url: str) -> str:
    if db_url.startswith("postgres"):
        return "postgresql"
    return "sqlite" if db_url.startswith("sqlite") else "mysql"


def digest(rows: list[tuple[Any, ...]]) -> str:
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def app_digests(db_url: str) -> tuple[str, str]:
    """The application's own columns, selected by name (batchrun's additions left out)."""
    users = query(db_url, f"SELECT {USER_COLUMNS} FROM user ORDER BY id")
    cards = query(db_url, f"SELECT {CARD_COLUMNS} FROM gift_card ORDER BY id")
    return digest(users), digest(cards)


def make_app_tables(
    db_url: str, *, users: int = 50, cards: int = 10, duplicate_code: bool = False
) -> None:
    """The seed's tables with data: a few inactive users, missing addresses and birthdays."""
    for ddl in APP_SCHEMA[dialect_of(db_url)]:
        query(db_url, ddl)
    rng = random.Random(2024)
    for n in range(1, users + 1):
        year, day = rng.randint(1950, 2005), rng.randint(1, 28)
        born = None if n % 17 == 0 else date(year, n % 12 + 1, day)
        email = None if n % 13 == 0 else f"app.user{n}@example.org"
        status = 0 if n % 11 == 0 else 10
        query(
            db_url,
            "INSERT INTO user (first_name, last_name, email, date_of_birth, status) "
            "VALUES (%s, %s, %s, %s, %s)",
            f"Fïrst{n}",
            f"O'Last{n}",
            email,
            born.isoformat() if born else None,
            status,
        )
    for n in range(1, cards + 1):
        code = "LEGACY01" if duplicate_code and n <= 2 else f"LEG{n:05d}"
        query(
            db_url,
            "INSERT INTO gift_card (recipient_email, message, status, scheduled_at, gift_code) "
            "VALUES (%s, %s, %s, %s, %s)",
            f"app.user{n}@example.org",
            "Happy birthday! from BURST",
            1,
            f"2024-{n % 12 + 1:02d}-01 00:00:00",
            code,
        )


def tables(db_url: str) -> set[str]:
    if dialect_of(db_url) == "sqlite":
        rows = query(db_url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    elif dialect_of(db_url) == "postgresql":
        rows = query(
            db_url,
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema()",
        )
    else:
        rows = query(db_url, "SHOW TABLES")
    return {str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_")}


def schema(db_url: str) -> list[tuple[Any, ...]]:
    """Every table's and index's definition, as the database reports it."""
    if dialect_of(db_url) == "sqlite":
        return query(db_url, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
    if dialect_of(db_url) == "postgresql":
        columns = query(
            db_url,
            "SELECT table_name, column_name, data_type, character_maximum_length, is_nullable, "
            "column_default FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position",
        )
        indexes = query(
            db_url,
            "SELECT i.indexrelid::regclass::text, i.indisvalid, pg_get_indexdef(i.indexrelid) "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "WHERE c.relnamespace = current_schema()::regnamespace ORDER BY 1",
        )
        return columns + indexes
    return [query(db_url, f"SHOW CREATE TABLE `{name}`")[0] for name in sorted(tables(db_url))]


def index_columns(db_url: str, table: str, index: str) -> list[str]:
    if dialect_of(db_url) == "sqlite":
        rows = query(db_url, f"SELECT name FROM pragma_index_info('{index}') ORDER BY seqno")
    elif dialect_of(db_url) == "postgresql":
        # Each key column's text: a column name, or the expression an index is built on.
        rows = query(
            db_url,
            "SELECT pg_get_indexdef(i.indexrelid, k, true) FROM pg_index i "
            "JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class tc ON tc.oid = i.indrelid "
            "CROSS JOIN generate_series(1, i.indnkeyatts) AS k "
            "WHERE tc.relname = %s AND ic.relname = %s ORDER BY k",
            table,
            index,
        )
    else:
        rows = query(
            db_url,
            "SELECT column_name FROM information_schema.statistics WHERE table_schema = "
            "DATABASE() AND table_name = %s AND index_name = %s ORDER BY seq_in_index",
            table,
            index,
        )
    return [str(r[0]) for r in rows]


def unique_single_column_indexes(db_url: str, table: str, column: str) -> list[str]:
    """Names of UNIQUE indexes on exactly ``table(column)``."""
    if dialect_of(db_url) == "sqlite":
        names = [
            str(r[0])
            for r in query(
                db_url, f"SELECT name FROM pragma_index_list('{table}') WHERE \"unique\" = 1"
            )
        ]
    elif dialect_of(db_url) == "postgresql":
        names = [
            str(r[0])
            for r in query(
                db_url,
                "SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid "
                "JOIN pg_class tc ON tc.oid = i.indrelid "
                "WHERE tc.relname = %s AND i.indisunique AND i.indisvalid",
                table,
            )
        ]
    else:
        names = [
            str(r[0])
            for r in query(
                db_url,
                "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema "
                "= DATABASE() AND table_name = %s AND non_unique = 0",
                table,
            )
        ]
    return [n for n in names if index_columns(db_url, table, n) == [column]]


async def migrate(db_url: str) -> list[str]:
    database = await connect(db_url, create=True)
    try:
        return await Store(database).migrate([Birthday()])
    finally:
        await database.close()


def month_of(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, date):
        return value.month
    return int(str(value)[5:7])


# -- an application database with data ------------------------------------------------------


async def test_migrate_keeps_application_data(db_url: str) -> None:
    make_app_tables(db_url)
    users_before, cards_before = app_digests(db_url)
    assert query(db_url, "SELECT COUNT(*) FROM user") == [(50,)]

    applied = await migrate(db_url)
    assert applied, "the first migrate applies steps"
    assert app_digests(db_url) == (users_before, cards_before)
    assert query(db_url, "SELECT COUNT(*) FROM user") == [(50,)]
    assert query(db_url, "SELECT COUNT(*) FROM gift_card") == [(10,)]
    assert tables(db_url) == {"user", "gift_card"} | BATCHRUN_TABLES

    # birth_month is the month of date_of_birth for every row, NULL without a birthday.
    rows = query(db_url, "SELECT id, date_of_birth, birth_month FROM user ORDER BY id")
    assert len(rows) == 50
    for uid, born, birth_month in rows:
        assert birth_month == month_of(born), (uid, born, birth_month)
    assert sum(1 for _, born, _ in rows if born is None) == 2
    assert query(db_url, "SELECT birth_month FROM user WHERE id IN (1, 12, 17) ORDER BY id") == [
        (2,),
        (1,),
        (None,),
    ]
    # It is generated: a changed birthday moves the user to another month.
    query(db_url, "UPDATE user SET date_of_birth = %s WHERE id = 1", "1990-11-05")
    assert query(db_url, "SELECT birth_month FROM user WHERE id = 1") == [(11,)]

    # PostgreSQL indexes the expression itself: no column, so no table rewrite.
    month = "EXTRACT(month FROM date_of_birth)" if dialect_of(db_url) == "postgresql" else None
    assert index_columns(db_url, "user", INDEX) == [month or "birth_month", "status", "id"]
    assert unique_single_column_indexes(db_url, "gift_card", "idempotency_key")
    assert unique_single_column_indexes(db_url, "gift_card", "gift_code")
    # The legacy cards have no key; a UNIQUE key allows any number of NULLs.
    assert query(db_url, "SELECT COUNT(*) FROM gift_card WHERE idempotency_key IS NULL") == [
        (10,),
    ]


async def test_second_migrate_changes_nothing(db_url: str) -> None:
    make_app_tables(db_url)
    await migrate(db_url)
    rows_before = table_digest(db_url)
    schema_before = schema(db_url)
    assert set(rows_before) - {"sqlite_sequence"} == {"user", "gift_card"} | BATCHRUN_TABLES

    assert await migrate(db_url) == []
    assert table_digest(db_url) == rows_before  # batchrun_schema's applied_at included
    assert schema(db_url) == schema_before
    assert await migrate(db_url) == []
    assert schema(db_url) == schema_before


async def test_idempotency_key_is_enforced_by_the_database(db_url: str) -> None:
    make_app_tables(db_url, users=5, cards=0)
    await migrate(db_url)
    insert = (
        "INSERT INTO gift_card (recipient_email, message, status, scheduled_at, gift_code, "
        "idempotency_key) VALUES (%s, 'm', 1, '2025-06-01 00:00:00', %s, %s)"
    )
    query(db_url, insert, "a@example.org", "CODE0000000000A1", "birthday:2025:1")
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        query(db_url, insert, "a@example.org", "CODE0000000000A2", "birthday:2025:1")
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        query(db_url, insert, "b@example.org", "CODE0000000000A1", "birthday:2025:2")
    assert query(db_url, "SELECT COUNT(*) FROM gift_card") == [(1,)]


async def test_job_runs_on_the_migrated_application_database(
    db_url: str, make_job: Callable[..., Any]
) -> None:
    make_app_tables(db_url, users=120, cards=10)
    await migrate(db_url)
    legacy = query(db_url, f"SELECT {CARD_COLUMNS} FROM gift_card ORDER BY id")
    users_before, _ = app_digests(db_url)
    number = 6
    expected = eligible_ids(db_url, number)
    assert len(expected) >= 5

    job = await make_job(db_url)
    summary = await job.run(month(2025, number), Options(concurrency=4, page_size=3))
    assert summary.eligible == len(expected)
    assert summary.emails_sent == summary.cards_created == len(expected)
    assert summary.failed == 0
    assert_one_card_each(db_url, expected)
    assert query(db_url, f"SELECT {CARD_COLUMNS} FROM gift_card WHERE id <= 10 ORDER BY id") == (
        legacy
    )
    assert app_digests(db_url)[0] == users_before
    emails = query(
        db_url,
        "SELECT u.email, g.recipient_email FROM gift_card g JOIN user u "
        "ON g.idempotency_key = CONCAT('birthday:2025:', u.id)"
        if dialect_of(db_url) == "mysql"
        else "SELECT u.email, g.recipient_email FROM gift_card g JOIN user u "
        "ON g.idempotency_key = 'birthday:2025:' || u.id",
    )
    assert len(emails) == len(expected)
    assert all(a == b for a, b in emails)


def test_duplicate_legacy_gift_codes_fail_cleanly(db_url: str) -> None:
    """Legacy 8-character Math.random codes can collide; migrate must not touch the data."""
    make_app_tables(db_url, duplicate_code=True)
    before = app_digests(db_url)
    result = run_cli("db", "migrate", env={"BATCHRUN_DB": db_url})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(error_lines) == 1, result.stderr
    assert "gift_code" in result.stderr or "LEGACY01" in result.stderr
    assert app_digests(db_url) == before


# -- an empty database -----------------------------------------------------------------------


async def test_not_migrated_is_reported(db_url: str) -> None:
    database = await connect(db_url, create=True)
    try:
        with pytest.raises(NotMigratedError, match="batchrun db migrate"):
            await Store(database).check_migrated()
    finally:
        await database.close()


async def test_migrate_empty_database_then_job_works(
    db_url: str, make_job: Callable[..., Any]
) -> None:
    applied = await migrate(db_url)
    assert applied[0].startswith("migrate_0000")
    assert len(applied) == len(set(applied))
    assert tables(db_url) == {"user", "gift_card"} | BATCHRUN_TABLES
    assert await migrate(db_url) == []

    database = await connect(db_url)
    try:
        store = Store(database)
        await store.check_migrated()
        assert await seed_users(store, 400, seed=11) == 400
    finally:
        await database.close()
    expected = eligible_ids(db_url, 9)
    addresses = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = 9"))
    valid = {uid for uid in expected if re.fullmatch(r"[^@\s]+@[^@\s]+\.\w+", addresses[uid])}
    assert valid

    job = await make_job(db_url)
    summary = await job.run(month(2025, 9), Options(concurrency=8))
    assert summary.eligible == len(expected)
    assert summary.skipped == len(expected - valid)
    assert summary.emails_sent == summary.cards_created == len(valid)
    assert_one_card_each(db_url, valid)


def test_migrate_cli_twice(db_url: str) -> None:
    first = run_cli("db", "migrate", env={"BATCHRUN_DB": db_url})
    assert first.returncode == 0, first.stderr
    before = (table_digest(db_url), schema(db_url))
    second = run_cli("db", "migrate", env={"BATCHRUN_DB": db_url})
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stderr
    assert (table_digest(db_url), schema(db_url)) == before


# -- the page query's plan -------------------------------------------------------------------


def _explain_columns(db_url: str) -> list[str]:
    """EXPLAIN's column names as this server reports them."""
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute("EXPLAIN SELECT id FROM user WHERE id = 1")
            return [str(d[0]).lower() for d in cur.description]
    finally:
        conn.close()


@pytest.mark.mysql
async def test_page_query_uses_index_on_mysql(mysql_url: str) -> None:
    await migrate(mysql_url)
    database = await connect(mysql_url)
    try:
        store = Store(database)
        await seed_users(store, 5000, seed=5)
        query(mysql_url, "ANALYZE TABLE user")
        columns = _explain_columns(mysql_url)
        table_at, key_at = columns.index("table"), columns.index("key")
        rows_at = columns.index("rows")
        for number in (1, 6, 12):
            rows = await demo.explain(store.jobdb, month(2025, number))
            plan = [tuple(r.values()) for r in rows]
            users = [row for row in plan if row[table_at] == "user"]
            assert len(users) == 1, plan
            assert users[0][key_at] == INDEX, plan
            assert int(users[0][rows_at]) < 5000 / 4, plan  # one month, not the table
    finally:
        await database.close()


async def test_page_query_uses_index_on_sqlite(sqlite_url: str) -> None:
    await migrate(sqlite_url)
    database = await connect(sqlite_url)
    try:
        store = Store(database)
        await seed_users(store, 2000, seed=5)
        plan = [tuple(r.values()) for r in await demo.explain(store.jobdb, month(2025, 6))]
    finally:
        await database.close()
    details = [str(row[-1]) for row in plan]
    assert any(INDEX in d and d.startswith("SEARCH user") for d in details), details
    assert not any(d.startswith("SCAN user") for d in details), details
    assert not any("TEMP B-TREE" in d for d in details), details  # ORDER BY id from the index

"""`db migrate` on a live database: online DDL, `--allow-locking`, `--plan` (MariaDB, SQLite).

Every DDL the birthday job runs on an application table states its algorithm and lock; a
writer running against a 200,000-row `user` table meanwhile never waits 0.5 s. A step the
server cannot run online (a MyISAM table) stops the migration with one line, unless
`--allow-locking`. `--plan` shows the steps with their table, algorithm, lock and row
estimate, and changes nothing.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from conftest import mysql_connect, query
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.db.sqlite import sqlite_path
from bench.migrate_stall import USER_TABLE, Writer, run_migration, seed_user_table

BATCHRUN_TABLES = {"batchrun_schema", "batchrun_ledger", "batchrun_queue", "batchrun_suppression"}
STALL_ROWS = 200_000
MAX_WAIT_S = 0.5  # the bound for any application write during the migration


def migrate(db_url: str, *args: str) -> Result:
    """``batchrun db migrate ARGS`` in-process, on ``db_url``, with a wide stderr."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    env.update({"COLUMNS": "400", "NO_COLOR": "1", "BATCHRUN_DB": db_url})
    return CliRunner().invoke(app, ["db", "migrate", *args], env=env)


def schema_of(db_url: str) -> dict[str, str]:
    """Every table's definition, by name."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            rows = conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
        finally:
            conn.close()
        return {str(name): str(sql) for name, sql in rows}
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            names = sorted(str(r[0]) for r in cur.fetchall())
            found = {}
            for name in names:
                cur.execute(f"SHOW CREATE TABLE `{name}`")
                found[name] = str(cur.fetchone()[1])  # type: ignore[index]
            return found
    finally:
        conn.close()


def app_user_table(db_url: str, rows: int, *, engine: str = "InnoDB") -> None:
    """An application's seed-shaped `user` table (no birth_month yet) with ``rows`` users."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            conn.execute(
                "CREATE TABLE user (id INTEGER PRIMARY KEY AUTOINCREMENT, first_name TEXT, "
                "last_name TEXT, email TEXT, date_of_birth TEXT, status INTEGER NOT NULL "
                "DEFAULT 10)"
            )
            conn.executemany(
                "INSERT INTO user (first_name, last_name, email, date_of_birth) "
                "VALUES ('A', 'B', ?, ?)",
                [(f"u{i}@example.com", f"1990-{i % 12 + 1:02d}-15") for i in range(rows)],
            )
            conn.commit()
        finally:
            conn.close()
        return
    conn = mysql_connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute(USER_TABLE.replace("ENGINE=InnoDB", f"ENGINE={engine}"))
            cur.execute(
                "INSERT INTO `user` (first_name, last_name, email, date_of_birth) "
                "SELECT 'A', 'B', CONCAT('u', seq, '@example.com'), "
                f"DATE_ADD('1990-01-15', INTERVAL seq % 12 MONTH) FROM seq_1_to_{rows}"
            )
            cur.execute("ANALYZE TABLE `user`")
            cur.fetchall()
    finally:
        conn.close()


def plan_json(db_url: str) -> list[dict[str, Any]]:
    done = migrate(db_url, "--plan", "--json")
    assert done.exit_code == 0, done.output
    steps = json.loads(done.stdout)
    assert isinstance(steps, list)
    return steps


# -- --plan ------------------------------------------------------------------------------


def test_plan_shows_each_step_and_changes_nothing(db_url: str) -> None:
    app_user_table(db_url, 120)
    before = schema_of(db_url)

    text = migrate(db_url, "--plan")
    steps = plan_json(db_url)

    assert text.exit_code == 0, text.output
    assert schema_of(db_url) == before  # nothing created, nothing altered
    assert not BATCHRUN_TABLES & set(schema_of(db_url))
    by_step = {s["step"]: s for s in steps}
    assert "birthday.migrate_0001_user" not in by_step  # the application's table is there
    column = by_step["birthday.migrate_0003_user_birth_month"]
    index = by_step["birthday.migrate_0004_user_birth_month_index"]
    assert column["table"] == index["table"] == "user"
    if db_url.startswith("mysql"):
        assert (column["algorithm"], column["lock"]) == ("INSTANT", None)
        assert (index["algorithm"], index["lock"]) == ("INPLACE", "NONE")
        assert 60 <= column["rows"] <= 240  # InnoDB's estimate, not a count
    else:
        assert column["rows"] == index["rows"] == 120
    assert by_step["migrate_0000_schema_table"]["rows"] is None  # created by the step
    assert by_step["birthday.migrate_0002_gift_card"]["statement"] == "create table"
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["step", "table", "statement", "algorithm", "lock", "rows"]
    assert len(lines) == len(steps) + 1
    row = next(line for line in lines if line.startswith("birthday.migrate_0004_"))
    assert row.split()[1] == "user"

    migrated = migrate(db_url)
    assert migrated.exit_code == 0, migrated.output
    assert plan_json(db_url) == []
    again = migrate(db_url, "--plan")
    assert again.exit_code == 0 and again.stdout == ""
    assert "up to date" in again.stderr


def test_plan_of_a_missing_sqlite_file_creates_no_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    done = migrate(url, "--plan")
    assert done.exit_code == 0, done.output
    assert "birthday.migrate_0001_user" in done.stdout  # every step, from an empty database
    assert "does not exist yet" in done.stderr
    assert not (tmp_path / "new.db").exists()


def test_plan_json_needs_plan(sqlite_url: str) -> None:
    done = migrate(sqlite_url, "--json")
    assert done.exit_code == 2
    assert "--json goes with --plan" in done.stderr


# -- a step that cannot run online ---------------------------------------------------------


def test_a_step_that_cannot_run_online_stops_with_one_line_unless_allow_locking(
    mysql_url: str,
) -> None:
    # A MyISAM table changes only by a copy under a lock: MariaDB refuses ALGORITHM=INSTANT.
    app_user_table(mysql_url, 500, engine="MyISAM")
    plan = {s["step"]: s for s in plan_json(mysql_url)}
    assert plan["birthday.migrate_0003_user_birth_month"]["algorithm"] == "INSTANT"

    refused = migrate(mysql_url)

    assert refused.exit_code == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert (
        "step birthday.migrate_0003_user_birth_month on user (500 rows) cannot run online"
        in (lines[0])
    )
    assert "ALGORITHM=INSTANT is not supported" in lines[0]
    assert "--allow-locking" in lines[0]
    columns = {r[0] for r in query(mysql_url, "SHOW COLUMNS FROM `user`")}
    assert "birth_month" not in columns  # the step did not run, nor anything after it
    assert "idempotency_key" not in {r[0] for r in query(mysql_url, "SHOW COLUMNS FROM gift_card")}

    locking = migrate(mysql_url, "--allow-locking")

    assert locking.exit_code == 0, locking.output
    assert "birthday.migrate_0003_user_birth_month" in locking.stderr
    assert "--allow-locking" in locking.stderr  # each locking step is logged
    assert "ALGORITHM=INPLACE is not supported" in locking.stderr  # the index step too
    ddl = schema_of(mysql_url)["user"]
    assert "`birth_month` tinyint(4) GENERATED ALWAYS AS (month(`date_of_birth`)) VIRTUAL" in ddl
    assert "KEY `idx_user_birth_month_status_id`" in ddl
    assert plan_json(mysql_url) == []
    june = query(mysql_url, "SELECT COUNT(*) FROM `user` WHERE birth_month = 6")[0][0]
    assert june == 500 // 12 + (1 if 500 % 12 >= 6 else 0)


def test_allow_locking_leaves_online_steps_online(mysql_url: str) -> None:
    """On InnoDB nothing is refused: --allow-locking changes nothing and logs nothing."""
    app_user_table(mysql_url, 200)
    done = migrate(mysql_url, "--allow-locking")
    assert done.exit_code == 0, done.output
    assert "cannot run online" not in done.stderr
    assert "VIRTUAL" in schema_of(mysql_url)["user"]


# -- an application writer during the migration -------------------------------------------


@pytest.mark.slow
def test_a_writer_never_waits_half_a_second_while_migrate_runs(mysql_url: str) -> None:
    seed_user_table(mysql_url, STALL_ROWS)
    writer = Writer(mysql_url, rate=100, max_id=STALL_ROWS)
    writer.start()
    try:
        time.sleep(0.5)  # the writer is in its stride
        start = time.monotonic()
        _, output = run_migration(mysql_url, "online")
        end = time.monotonic()
        time.sleep(0.5)
    finally:
        writer.stop()

    waits = writer.waits.during(start, end)
    assert writer.waits.errors == []
    assert len(waits) >= 20  # the writer ran all through the migration
    assert max(waits) < MAX_WAIT_S, f"a write waited {max(waits):.3f} s during db migrate"
    assert "birthday.migrate_0004_user_birth_month_index" in output
    assert "VIRTUAL" in schema_of(mysql_url)["user"]
    rows = query(mysql_url, "SELECT COUNT(*) FROM `user`")[0][0]
    assert rows == STALL_ROWS + writer.loops  # every INSERT of the writer landed

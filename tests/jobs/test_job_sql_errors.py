"""A mistake in a job's own SQL is the job's, said in one line naming it; only batchrun's
own statements that miss a table ask for ``batchrun db migrate``. On SQLite, MariaDB and
PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from support.cli import run_cli
from support.db import query

JOB = """
import batchrun


class Typo(batchrun.Job):
    name = "typo"
    period = "day"

    async def page(self, ctx, after, limit):
        return await ctx.db.fetch(
            "SELECT id FROM {table} WHERE id > :after ORDER BY id LIMIT :limit",
            after=after,
            limit=limit,
        )

    async def process(self, ctx, row):
        await ctx.db.execute("UPDATE {updated} SET id = id WHERE id = :id", id=row["id"])
"""


def test_a_typo_in_a_jobs_table_is_the_jobs_error_not_a_missing_migration(
    db_url: str, tmp_path: Path
) -> None:
    """It said "database … is missing batchrun's tables (no such table: subscription): run
    `batchrun db migrate`" from run, status, preview, why and db explain alike."""
    module = tmp_path / "typo.py"
    module.write_text(JOB.format(table="subscriptoin", updated="thing"))
    env = {"BATCHRUN_DB": db_url, "BATCHRUN_JOBS": str(module), "BATCHRUN_BUILTIN_JOBS": ""}
    assert run_cli("db", "migrate", env=env).returncode == 0
    for args in (
        ("run", "typo", "--period", "2025-07-01", "--dry-run"),
        ("run", "typo", "--period", "2025-07-01"),
        ("status", "typo", "--period", "2025-07-01"),
        ("preview", "typo", "--id", "1", "--period", "2025-07-01"),
    ):
        result = run_cli(*args, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("error: job 'typo': page(): database "), lines
        assert "subscriptoin" in lines[0] and "migrate" not in lines[0], lines


def test_a_typo_in_a_statement_of_process_stops_the_run_as_a_bug(
    db_url: str, tmp_path: Path
) -> None:
    """The same SQL fails for every entity: it was retried as a database error, the whole
    period queued for retries that failed alike (exit 3); now ten in a row stop the run
    (exit 1, one line), as any bug does. The database's outages are still no bug."""
    module = tmp_path / "typo.py"
    module.write_text(JOB.format(table="thing", updated="thnig"))
    env = {"BATCHRUN_DB": db_url, "BATCHRUN_JOBS": str(module), "BATCHRUN_BUILTIN_JOBS": ""}
    assert run_cli("db", "migrate", env=env).returncode == 0
    query(db_url, "CREATE TABLE thing (id INTEGER PRIMARY KEY)")
    for n in range(1, 41):
        query(db_url, "INSERT INTO thing (id) VALUES (%s)", n)
    result = run_cli("run", "typo", "--period", "2025-07-01", env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "job 'typo' has a bug: StatementError: database " in lines[0], lines
    assert "thnig" in lines[0] and "(10 entities in a row)" in lines[0], lines

"""A mistake in a job's own SQL is the job's, said in one line naming it; only batchrun's
own statements that miss a table ask for ``batchrun db migrate``. On SQLite, MariaDB and
PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from support.cli import run_cli

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
        pass
"""


def test_a_typo_in_a_jobs_table_is_the_jobs_error_not_a_missing_migration(
    db_url: str, tmp_path: Path
) -> None:
    """It said "database … is missing batchrun's tables (no such table: subscription): run
    `batchrun db migrate`" from run, status, preview, why and db explain alike."""
    module = tmp_path / "typo.py"
    module.write_text(JOB.format(table="subscriptoin"))
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

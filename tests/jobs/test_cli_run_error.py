"""A run that ends on an error: one ``error:`` line on stderr, a
traceback only with ``-v``, and with ``--json`` still its JSON summary with ``"error"``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_cli

JOBS = """
import batchrun


class Broken(batchrun.Job):
    name = "broken"
    period = "month"

    async def page(self, ctx, after, limit):
        if after == 0:
            return [{"id": 1}, {"id": 2}]
        raise RuntimeError("the page broke [/tmp/x]")

    async def process(self, ctx, row):
        pass


# Every entity fails its run; on the retry, entity 15 drops the queue's table, so the
# drain ends on an error after its first batch (ids 1-10) succeeded.
class Drained(batchrun.Job):

    name = "drained"
    period = "month"

    async def page(self, ctx, after, limit):
        return [{"id": i} for i in range(after + 1, min(after + limit, 30) + 1)]

    async def process(self, ctx, row):
        if ctx.env.get("FAIL_ALL"):
            raise batchrun.Retry("not yet")
        if row["id"] == 15:
            await ctx.db.execute("DROP TABLE batchrun_queue")


class Unordered(batchrun.Job):
    name = "unordered"
    period = "month"

    async def page(self, ctx, after, limit):
        return [{"id": 5}, {"id": 3}]

    async def process(self, ctx, row):
        pass
"""


@pytest.fixture
def env(sqlite_url: str, tmp_path: Path) -> dict[str, str]:
    jobs = tmp_path / "jobs.py"
    jobs.write_text(JOBS)
    env = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_JOBS": str(jobs),
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "COLUMNS": "400",
    }
    migrated = run_cli("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    return env


@pytest.mark.parametrize(
    ("job", "says"),
    [
        ("broken", "RuntimeError: the page broke [/tmp/x]"),  # not a batchrun error
        ("unordered", "ids must be ascending"),  # a JobError
    ],
)
def test_a_run_ending_on_an_error_prints_one_line_and_its_json(
    env: dict[str, str], job: str, says: str
) -> None:
    result = run_cli("run", job, "--period", "2025-06", "--json", env=env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    data = json.loads(result.stdout)
    assert data["error"] == errors[0].removeprefix("error: ")
    assert (data["job"], data["period"], data["dry_run"]) == (job, "2025-06", False)
    assert data["eligible"] == (2 if job == "broken" else 0)

    verbose = run_cli("-v", "run", job, "--period", "2025-07", env=env)
    assert verbose.returncode == 1
    assert "Traceback" in verbose.stderr


def test_a_retry_ending_on_an_error_still_counts_what_it_did(env: dict[str, str]) -> None:
    """Its JSON said 0 succeeded, though it had finished the entities of its first batch."""
    base = {**env, "BATCHRUN_RETRY_BASE_S": "0"}
    failed = run_cli(
        "run", "drained", "--period", "2025-06", "--json", env={**base, "FAIL_ALL": "1"}
    )
    assert failed.returncode == 3, failed.stderr
    assert json.loads(failed.stdout)["queued_for_retry"] == 30

    drained = run_cli("retry", "--concurrency", "1", "--json", env=base)
    assert drained.returncode == 1, drained.stderr
    assert "batchrun_queue" in drained.stderr, drained.stderr
    data = json.loads(drained.stdout)
    assert "error" in data, data
    assert data["succeeded"] >= 10, data
    assert data["processed"] >= data["succeeded"], data
    assert data["duration_s"] > 0, data

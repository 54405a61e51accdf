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

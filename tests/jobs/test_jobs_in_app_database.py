"""A team's own jobs in an application's database: the built-in birthday job, whose tables
are not there, says so once (or is left out with BATCHRUN_BUILTIN_JOBS=), `status` skips
it with a note, and each job's email comes from its own sender."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from support import ROOT
from support.cli import assert_clean_failure, invoke, text

RENEWAL = str(ROOT / "examples" / "renewal" / "renewal.py")
NOTE = "job 'birthday' needs user, gift_card"

pytestmark = pytest.mark.usefixtures("restore_root_logger")


@pytest.fixture
def app_env(tmp_path: Path) -> dict[str, str]:
    """An application's SQLite database: its own account table, no user table."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE account (id INTEGER PRIMARY KEY, contact TEXT, name TEXT NOT NULL, "
            "renews_on TEXT NOT NULL, active INTEGER NOT NULL DEFAULT 1)"
        )
        conn.executemany(
            "INSERT INTO account VALUES (?, ?, ?, '2025-06-08', 1)",
            [(1, "ann@example.com", "Ann"), (2, "bob@example.com", "Bob"), (3, None, "Cy")],
        )
    conn.close()
    return {
        "BATCHRUN_DB": f"sqlite:///{path}",
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_JOBS": RENEWAL,
    }


def test_migrate_notes_the_missing_tables_once(app_env: dict[str, str]) -> None:
    first = invoke("db", "migrate", env=app_env)
    assert first.exit_code == 0, text(first)
    assert text(first).count(NOTE) == 1
    again = invoke("db", "migrate", env=app_env)
    assert again.exit_code == 0, text(again)
    assert NOTE not in text(again) and "is up to date" in text(again)
    verbose = invoke("-v", "db", "migrate", env=app_env)
    assert text(verbose).count(NOTE) == 1  # -v still shows it, as a log line
    assert "note:" not in text(verbose)


def test_status_skips_a_job_without_its_tables(app_env: dict[str, str]) -> None:
    assert invoke("db", "migrate", env=app_env).exit_code == 0
    ran = invoke("run", "renewal", "--period", "2025-06-01", "--json", env=app_env)
    assert ran.exit_code == 0, text(ran)

    overview = invoke("status", "--json", env=app_env)  # every job's runs
    assert overview.exit_code == 0, text(overview)
    assert set(json.loads(overview.stdout)["jobs"]) == {"birthday", "renewal"}
    assert "note: " + NOTE in overview.stderr

    shown = invoke("status", "renewal", "--period", "2025-06-01", "--json", env=app_env)
    assert shown.exit_code == 0, text(shown)
    data = json.loads(shown.stdout)
    assert (data["job"], data["succeeded"], data["skipped"]) == ("renewal", 2, 1)

    plain = invoke("status", "renewal", "--period", "2025-06-01", env=app_env)
    assert plain.exit_code == 0 and "status renewal 2025-06-01" in text(plain)
    # Named, the job without its tables is the error it always was.
    named = invoke("status", "birthday", env=app_env)
    assert NOTE in assert_clean_failure(named, 1)


def test_builtin_jobs_empty_leaves_the_birthday_job_out(app_env: dict[str, str]) -> None:
    env = {**app_env, "BATCHRUN_BUILTIN_JOBS": ""}
    listed = invoke("jobs", "--json", env=env)
    assert [job["name"] for job in json.loads(listed.stdout)] == ["renewal"]
    migrated = invoke("db", "migrate", env=env)
    assert migrated.exit_code == 0 and "birthday" not in text(migrated)
    status = invoke("status", env=env)
    assert status.exit_code == 0 and "birthday" not in text(status)
    unknown = invoke("run", "birthday", env=env)
    assert "unknown job 'birthday'" in assert_clean_failure(unknown, 2)

    named = invoke("jobs", "--json", env={**app_env, "BATCHRUN_BUILTIN_JOBS": "birthday"})
    assert [job["name"] for job in json.loads(named.stdout)] == ["birthday", "renewal"]
    wrong = invoke("jobs", env={**app_env, "BATCHRUN_BUILTIN_JOBS": "birthdays"})
    out = assert_clean_failure(wrong, 2)
    assert "BATCHRUN_BUILTIN_JOBS: 'birthdays' is not a built-in job" in out


def test_each_job_sends_from_its_own_address(app_env: dict[str, str], tmp_path: Path) -> None:
    assert invoke("db", "migrate", env=app_env).exit_code == 0
    ran = invoke("run", "renewal", "--period", "2025-06-01", env=app_env)
    assert ran.exit_code == 0, text(ran)
    sent = sorted((tmp_path / "outbox").glob("*.eml"))
    assert len(sent) == 2
    assert all(p.read_bytes().startswith(b"From: renewal@localhost\r\n") for p in sent)
    assert all(b"Message-ID: <renewal.2025-06-01." in p.read_bytes() for p in sent)

    ops = {**app_env, "BATCHRUN_FROM": "Ops <ops@corp.example>"}
    again = invoke("run", "renewal", "--period", "2025-06-02", env=ops)
    assert again.exit_code == 0
    # 2025-06-02 reminds of 2025-06-09: nobody; preview shows the sender it would use.
    preview = invoke("preview", "renewal", "--period", "2025-06-01", "--id", "1", env=ops)
    assert preview.exit_code == 0, text(preview)
    assert "From: Ops <ops@corp.example>" in preview.stdout


def test_status_of_several_jobs_reads_each_period(tmp_path: Path) -> None:
    env = {
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'demo.db'}",
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_JOBS": RENEWAL,
    }
    assert invoke("db", "migrate", env=env).exit_code == 0  # an empty database: both jobs' tables
    both = invoke("status", "--json", env=env)
    assert both.exit_code == 0, text(both)
    assert set(json.loads(both.stdout)["jobs"]) == {"birthday", "renewal"}
    # A month names the month jobs only: birthday's object, as batchrun 0.2 printed it.
    assert "note:" not in both.stderr  # every job has its tables
    month = invoke("status", "--month", "2025-06", "--json", env=env)
    assert json.loads(month.stdout)["job"] == "birthday"
    assert "cards" in json.loads(month.stdout)

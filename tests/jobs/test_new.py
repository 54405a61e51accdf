"""`batchrun new JOB`: the files it writes, their own test passing as written (in a pytest
of its own), and the job running on the demo database of every backend."""

from __future__ import annotations

import json
import keyword
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli

from batchrun.errors import UsageError
from batchrun.scaffold import Scaffold


def test_new_writes_a_job_its_templates_and_a_test_that_passes(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    made = run_cli("new", "win_back", "--dir", str(folder), "--table", "customer", env={})
    assert made.returncode == 0, made.stderr
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == [
        "templates/win_back/body.html",
        "templates/win_back/body.txt",
        "templates/win_back/subject.txt",
        "test_win_back.py",
        "win_back.py",
    ]
    assert "class WinBackJob(batchrun.Job)" in (folder / "win_back.py").read_text()
    assert '{% extends "layout.html" %}' in (folder / "templates/win_back/body.html").read_text()
    assert "wrote" in made.stderr and "test_win_back.py" in made.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_win_back.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "4 passed" in tested.stdout

    again = run_cli("new", "win_back", "--dir", str(folder), env={})
    assert again.returncode == 2 and "exists already" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["new", "Win-Back"], "lower-case letters"),
        (["new", "json"], "would shadow"),
        (["new", "ok", "--table", "a; DROP TABLE x"], "not a plain table name"),
        # `--jobs b/birthday.py run birthday` would find two jobs named 'birthday'.
        (["new", "birthday"], "built-in job: with both loaded"),
        # The test's `from import import ImportJob` would be a SyntaxError.
        (["new", "import"], "is a Python keyword"),
        (["new", "async"], "is a Python keyword"),
        # Imported before the test imports the job, so `from pytest import ...` gets them.
        (["new", "pytest"], "would shadow the module pytest"),
        (["new", "jinja2"], "would shadow the module jinja2"),
    ],
)
def test_new_refuses_names_it_cannot_use(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli(*args, "--dir", str(tmp_path), env={})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["birthday", "import", "pytest"])
def test_a_refused_name_comes_with_one_to_use_instead(name: str) -> None:
    with pytest.raises(UsageError, match=f"choose another name, such as 'my_{name}'"):
        Scaffold(name)
    Scaffold(f"my_{name}")


def test_no_keyword_is_a_job_name_and_soft_keywords_write_python_that_parses() -> None:
    for word in keyword.kwlist:
        with pytest.raises(UsageError):
            Scaffold(word)
    for word in ("match", "case"):  # `from match import MatchJob` is Python
        for path, text in Scaffold(word).files().items():
            if path.endswith(".py"):
                compile(text, path, "exec")


def test_the_new_job_runs_on_the_demo_database(db_url: str, tmp_path: Path) -> None:
    Scaffold("promo").write(tmp_path)
    env = {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_JOBS": str(tmp_path / "promo.py"),
    }
    for step in (["db", "migrate"], ["db", "seed", "--users", "200"]):
        done = run_cli(*step, env=env)
        assert done.returncode == 0, done.stderr
    ran = run_cli("run", "promo", "--period", "2025-06", "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["eligible"] == 200
    assert summary["succeeded"] == summary["emails_sent"] > 150
    assert summary["succeeded"] + summary["skipped"] == 200
    outbox = sorted((tmp_path / "outbox").iterdir())
    assert len(outbox) == summary["emails_sent"]
    first = outbox[0].read_text()
    assert "From: promo@localhost" in first and "Subject: Your monthly update for 2025-06" in first
    rerun = run_cli("run", "promo", "--period", "2025-06", "--json", env=env)
    assert json.loads(rerun.stdout)["eligible"] == 0


def test_the_files_pass_ruff_with_its_default_rules_and_format(tmp_path: Path) -> None:
    """A team's linter and formatter, at their defaults, find nothing to say: for every
    length of job and table name allowed (a line's length decides how it is wrapped)."""
    ruff = str(Path(sys.executable).with_name("ruff"))  # the dev extra's
    cases = [("j" * n, "customer") for n in range(1, 33)]
    cases += [("win_back", "t" * n) for n in range(1, 65)]
    for name, table in cases:
        folder = tmp_path / f"{name}-{len(table)}"
        Scaffold(name, table=table).write(folder)
        for check in (["check"], ["format", "--check"]):
            done = subprocess.run(
                [ruff, *check, "--isolated", "--no-cache", "."],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, (name, table, done.stdout + done.stderr)

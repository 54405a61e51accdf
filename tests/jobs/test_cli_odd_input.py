"""Small odd inputs, each one clear line and the contract's exit
code: text with rich markup in it, a --jobs module that calls sys.exit(0), a MySQL URL
with a bad connect_timeout, and a backslash-escaped quote in a MySQL string literal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_cli
from support.db import query

from batchrun.db.sql import Queries


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_error_text_with_markup_in_it_is_printed_as_it_is(tmp_path: Path) -> None:
    spec = str(tmp_path / "jobs[/path]" / "[bold]x[/].py")
    result = run_cli(
        "--jobs", spec, "status", env={"BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}"}
    )
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert line.startswith("error: ") and "jobs[/path]/[bold]x[/].py: no such file" in line


def test_a_problem_whose_error_holds_markup_is_listed_by_status(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'b.db'}"
    assert run_cli("db", "migrate", env={"BATCHRUN_DB": db}).returncode == 0
    query(
        db,
        "INSERT INTO batchrun_ledger (job, once_key, entity_id, period, state, attempts, "
        "queued, last_error, updated_at) VALUES ('birthday', '2025', 7, '2025-06', 4, 1, 0, "
        "%s, 0)",
        "cannot open [/var/spool/x] [red]",
    )
    result = run_cli("status", "--month", "2025-06", env={"BATCHRUN_DB": db, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "cannot open [/var/spool/x] [red]" in result.stdout


@pytest.mark.parametrize("code", ["0", "3", "'bye'"])
def test_a_jobs_module_that_exits_on_import_is_an_error_naming_it(
    tmp_path: Path, code: str
) -> None:
    module = tmp_path / "quitter.py"
    module.write_text(f"import sys\nsys.exit({code})\n")
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}"}
    for spec in (str(module), "quitter"):
        result = run_cli("--jobs", spec, "status", env={**env, "PYTHONPATH": str(tmp_path)})
        assert result.returncode == 2, (spec, result.returncode, result.stderr)
        line = one_line(result.stderr)
        assert spec in line and f"sys.exit({code})" in line


@pytest.mark.parametrize("value", ["zz", "-1", "0", "inf", "nan"])
def test_a_mysql_url_with_a_bad_connect_timeout_is_one_line_and_exit_2(value: str) -> None:
    url = f"mysql://root:s3cret@127.0.0.1:3306/batchrun?connect_timeout={value}"
    result = run_cli("status", env={"BATCHRUN_DB": url})
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert "connect_timeout" in line and "s3cret" not in line


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("BATCHRUN_DB", "mysql://u:Hunter3Secret@[::1/app"),
        ("BATCHRUN_DB", "postgresql://postgres:Hunter3Secret@[::1:5432/app"),
        ("BATCHRUN_RETRY_QUEUE", "https://u:Hunter3Secret@[sqs.example/1/q"),
    ],
)
def test_a_url_with_an_unclosed_bracket_is_one_line_and_exit_2(
    variable: str, url: str, tmp_path: Path
) -> None:
    """An unclosed '[' (an IPv6 host) was a 221-line traceback, its handler failing again."""
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'app.db'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    result = run_cli("status", env=env | {variable: url})
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert "unusable URL" in line and "Invalid IPv6 URL" in line, line
    assert "Hunter3Secret" not in result.stderr + result.stdout and "***" in line


@pytest.mark.parametrize(
    ("dialect", "mark", "text", "sql"),
    [
        # MySQL: a backslash escapes the quote, so the string goes on past it.
        ("mysql", "%s", r"SELECT 'it\'s :x' AS a, :y", r"SELECT 'it\'s :x' AS a, %s"),
        ("mysql", "%s", r'SELECT "say \":x\"", :y', r'SELECT "say \":x\"", %s'),
        ("mysql", "%s", r"SELECT 'back\\', :y", r"SELECT 'back\\', %s"),  # an escaped backslash
        ("mysql", "%s", "SELECT 'a''b :x', :y", "SELECT 'a''b :x', %s"),
        ("mysql", "%s", "SELECT '100%', :y", "SELECT '100%%', %s"),  # pymysql formats all
        # Standard SQL: a backslash is a character; the quote after it ends the string.
        ("sqlite", "?", r"SELECT 'C:\' AS a, :y", r"SELECT 'C:\' AS a, ?"),
        ("postgresql", "$n", r"SELECT 'C:\' AS a, :y", r"SELECT 'C:\' AS a, $1"),
        ("postgresql", "$n", r"SELECT E'it\'s :x', :y", r"SELECT E'it\'s :x', $1"),
        ("postgresql", "$n", "SELECT :y::int /* :x */ -- :x", "SELECT $1::int /* :x */ -- :x"),
    ],
)
def test_the_tokenizer_reads_each_dialects_string_literals(
    dialect: str, mark: str, text: str, sql: str
) -> None:
    queries = Queries(dialect, mark, {})
    assert queries.compile_text(text, text, {"y": 1}) == (sql, (1,))


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (("--mail", "foo://x"), "unknown --mail URL scheme 'foo'"),
        (("--retry-queue", "foo://x"), "unknown retry queue URL 'foo://x'"),
        (("--retry-queue", "sqs://q"), "give the queue's URL"),
        (("--from", "no-at-sign"), "--from 'no-at-sign' is not a usable sender address"),
    ],
)
def test_a_dry_run_checks_the_urls_the_real_run_would_use(
    tmp_path: Path, option: tuple[str, str], said: str
) -> None:
    """A dry run opens no mailer and no queue, but is the check people run before a real
    run: a typo there is the same usage error, exit 2, with nothing written."""
    db = f"sqlite:///{tmp_path / 'b.db'}"
    assert run_cli("db", "migrate", env={"BATCHRUN_DB": db}).returncode == 0
    for command in (("birthday", "--month", "2025-06"), ("run", "birthday", "--period", "2025-06")):
        result = run_cli(*option, *command, "--dry-run", env={"BATCHRUN_DB": db})
        assert result.returncode == 2, result.stderr
        assert said in one_line(result.stderr), result.stderr
    fine = run_cli("birthday", "--month", "2025-06", "--dry-run", env={"BATCHRUN_DB": db})
    assert fine.returncode == 0, fine.stderr


def test_a_concurrency_past_the_cap_and_a_dry_run_fan_out_are_refused_first(
    tmp_path: Path,
) -> None:
    """--concurrency 10**20 grew to 24 GB before the first entity; --dry-run --fan-out
    queued shards that a later retry ran for real. Each is now one line, exit 2, and
    nothing is written."""
    db = f"sqlite:///{tmp_path / 'b.db'}"
    env = {"BATCHRUN_DB": db, "BATCHRUN_MAIL": f"file://{tmp_path / 'out'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "200", env=env).returncode == 0
    month = ("birthday", "--month", "2025-06")
    for args, extra, says in (
        ((*month, "--concurrency", "99999999999999999999"), {}, "--concurrency"),
        (("retry", "--concurrency", "10001"), {}, "--concurrency"),
        (month, {"BATCHRUN_CONCURRENCY": "20000"}, "BATCHRUN_CONCURRENCY must be at most"),
        ((*month, "--dry-run", "--fan-out", ""), {}, "--dry-run queues nothing"),
    ):
        result = run_cli(*args, env=env | extra, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert says in one_line(result.stderr), result.stderr
    assert query(db, "SELECT COUNT(*) FROM batchrun_queue") == [(0,)]
    assert query(db, "SELECT COUNT(*) FROM batchrun_ledger") == [(0,)]


def test_numbers_no_table_or_clock_can_hold_are_usage_errors(tmp_path: Path) -> None:
    """They reached the database and failed there ("Python int too large to convert to
    SQLite INTEGER", exit 1), or overflowed a deadline."""
    db = f"sqlite:///{tmp_path / 'b.db'}"
    env = {"BATCHRUN_DB": db, "BATCHRUN_MAIL": f"file://{tmp_path / 'out'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    huge = "99999999999999999999"
    for args, extra in (
        (("why", "birthday", huge), {}),
        (("preview", "birthday", "--id", huge), {}),
        (("worker", "--visibility", "inf"), {}),
        (("birthday", "--month", "2025-06", "--dry-run"), {"BATCHRUN_LEASE_S": "1e300"}),
    ):
        result = run_cli(*args, env=env | extra, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        one_line(result.stderr)
    every = run_cli("runs", "--since", f"{huge}d", "--json", env=env)
    assert every.returncode == 0 and every.stdout.strip() == "[]", every.stderr


def test_files_folders_and_text_that_cannot_be_meant_are_one_line_before_any_work(
    tmp_path: Path,
) -> None:
    """Each failed after its work (exit 1, "Device or resource busy", a traceback's last
    line), was accepted silently, or printed two lines; a pause reason's newline and
    terminal escape broke the status table."""
    db = f"sqlite:///{tmp_path / 'b.db'}"
    env = {"BATCHRUN_DB": db, "BATCHRUN_MAIL": f"file://{tmp_path / 'out'}"}
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "50", env=env).returncode == 0
    month = ("birthday", "--month", "2025-06")
    missing = str(tmp_path / "nowhere" / "x")
    for args, extra, says in (
        (("metrics", "--textfile", ""), {}, "a folder, not a file"),
        (("metrics", "--textfile", missing), {}, "no folder"),
        (("preview", "birthday", "--id", "9", "--html", str(tmp_path)), {}, "a folder"),
        (("preview", "birthday", "--id", "9", "--html", missing), {}, "no folder"),
        (("suppress", "remove", " "), {}, "an empty address"),
        (month, {"BATCHRUN_TEMPLATES": missing}, "no such folder"),
        (("--templates", missing, *month, "--dry-run"), {}, "no such folder"),
        (("--templates", missing, "preview", "birthday", "--id", "9"), {}, "no such folder"),
    ):
        result = run_cli(*args, env=env | extra, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert says in one_line(result.stderr), (args, result.stderr)
    assert query(db, "SELECT COUNT(*) FROM batchrun_ledger") == [(0,)]
    assert not (tmp_path / "out").exists(), "nothing sent"

    redrive = run_cli("dead", "redrive", "--id", "123456", env=env)
    assert redrive.returncode == 1
    assert "no dead letter with id 123456" in one_line(redrive.stderr)

    reason = "SES complaints\n\x1b[31mtoo many\tfor now"
    assert run_cli("pause", "birthday", "--reason", reason, env=env).returncode == 0
    status = run_cli("status", env=env | {"COLUMNS": "200"})
    row = next(line for line in status.stdout.splitlines() if line.startswith("birthday"))
    assert row.endswith("every period (SES complaints [31mtoo many for now)"), status.stdout
    assert "\x1b" not in status.stdout


@pytest.mark.parametrize(
    "args", [("status",), ("runs", "--json"), ("preview", "birthday", "--id", "9")]
)
def test_a_reader_that_goes_away_ends_the_command_quietly(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """``batchrun ... | head -1``: a BrokenPipeError line and exit 1 (or rich's silent 1)
    before; now nothing on stderr and 141, as for a program SIGPIPE ended."""
    db = f"sqlite:///{tmp_path / 'b.db'}"
    env = {"BATCHRUN_DB": db}
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "50", env=env).returncode == 0
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
        done = subprocess.run(
            [sys.executable, "-m", "batchrun", *args],
            env=full,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, ""), done.stderr


def test_a_broken_pipe_that_is_not_stdouts_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a reader of stdout gone away is quiet (141): a BrokenPipeError from another
    pipe or socket is an error like any other, one line and exit 1."""
    from typer.testing import CliRunner

    from batchrun.cli import app
    from batchrun.control.history import History

    db = f"sqlite:///{tmp_path / 'b.db'}"
    assert run_cli("db", "migrate", env={"BATCHRUN_DB": db}).returncode == 0

    async def broken(*args: object, **kwargs: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(History, "runs", broken)
    result = CliRunner().invoke(app, ["--db", db, "runs"])
    assert result.exit_code == 1, result.output
    assert "error: BrokenPipeError" in result.output


def test_a_logged_exception_is_one_line_without_v_and_its_frames_with_v(tmp_path: Path) -> None:
    """A record logged with its exception (a driver's pool warning, a second worker's
    failure) printed a traceback on every run, -v or not."""
    jobs = tmp_path / "noisy.py"
    jobs.write_text(
        "import logging\n"
        "import batchrun\n\n"
        "class Noisy(batchrun.Job):\n"
        "    name = 'noisy'\n"
        "    address = None\n\n"
        "    async def page(self, ctx, after, limit):\n"
        "        return [{'id': 1}] if after == 0 else []\n\n"
        "    async def process(self, ctx, row):\n"
        "        try:\n"
        "            raise ValueError('pool floor')\n"
        "        except ValueError:\n"
        "            logging.getLogger('some.driver').warning('retrying', exc_info=True)\n"
    )
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'app.db'}", "BATCHRUN_JOBS": str(jobs)}
    assert run_cli("db", "migrate", env=env).returncode == 0
    quiet = run_cli("run", "noisy", "--period", "2025-06", "--json", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "Traceback" not in quiet.stderr
    assert "retrying: ValueError: pool floor" in quiet.stderr, quiet.stderr
    told = run_cli("-v", "run", "noisy", "--period", "2025-07", "--json", env=env)
    assert told.returncode == 0 and "Traceback" in told.stderr, told.stderr

"""The command line, through typer's CliRunner: exit codes, messages, JSON, and what it writes.

Configuration goes in through ``invoke(env=...)`` only; os.environ is never changed. Click 8.2+
keeps stdout and stderr apart (``result.stdout``, ``result.stderr``) and interleaves both in
``result.output``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest
from support.birthday import eligible_ids
from support.cli import ANSI, assert_clean_failure, invoke, migrate_and_seed, run_cli, text
from support.db import query, table_digest
from typer.testing import CliRunner

import batchrun
from batchrun.cli import app
from batchrun.db.sqlite import sqlite_path

BIRTHDAY_KEYS = {
    "job",
    "month",
    "dry_run",
    "eligible",
    "skipped",
    "cards_created",
    "emails_sent",
    "failed",
    "queued_for_retry",
    "dead_lettered",
    "duration_s",
}
STATUS_KEYS = {
    "month",
    "cards",
    "emails_sent",
    "pending",
    "skipped",
    "failed_permanent",
    "retry_queue_depth",
    "dead_letter_depth",
}
pytestmark = pytest.mark.usefixtures("restore_root_logger")

VALID = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def outbox_files(outbox: Path) -> list[Path]:
    return sorted(outbox.glob("*.eml")) if outbox.exists() else []


def outbox_digest(outbox: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in outbox_files(outbox)}


@pytest.fixture
def outbox(tmp_path: Path) -> Path:
    return tmp_path / "outbox"


@pytest.fixture
def db_file(env: dict[str, str]) -> Path:
    return Path(sqlite_path(env["BATCHRUN_DB"]))


def invalid_ids(db_url: str, month: int) -> set[int]:
    rows = query(
        db_url,
        "SELECT id, email FROM user WHERE birth_month = %s AND status = 10 AND email IS NOT NULL",
        month,
    )
    return {int(uid) for uid, email in rows if not VALID.fullmatch(str(email))}


# -- usage errors: exit 2, one line, nothing written -----------------------------------------


@pytest.mark.parametrize("month", ["2025-13", "25-06", "", "2025-00", "June"])
def test_bad_month_is_usage_error(
    month: str, env: dict[str, str], db_file: Path, outbox: Path
) -> None:
    result = invoke("birthday", "--month", month, "--json", env=env)
    out = assert_clean_failure(result, 2)
    assert result.stdout == ""
    naming = [line for line in lines(out) if f"invalid month '{month}'" in line]
    assert len(naming) == 1, out  # one line names the option's bad value
    assert "--month" in naming[0]
    assert "YYYY-MM" in naming[0]
    assert not db_file.exists()
    assert not outbox.exists()


@pytest.mark.parametrize("command", [["status"], ["db", "explain"]])
def test_bad_month_on_other_commands(
    command: list[str], env: dict[str, str], db_file: Path
) -> None:
    result = invoke(*command, "--month", "2025-13", env=env)
    out = assert_clean_failure(result, 2)
    assert "invalid month '2025-13'" in out
    assert not db_file.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "0"],
        ["--concurrency", "-3"],
        ["--page-size", "0"],
        ["--limit", "0"],
        ["--rate", "0"],
    ],
)
def test_bad_numbers_are_usage_errors(
    args: list[str], env: dict[str, str], db_file: Path, outbox: Path
) -> None:
    result = invoke("birthday", "--month", "2025-03", *args, env=env)
    out = assert_clean_failure(result, 2)
    assert args[0] in out
    assert not db_file.exists()
    assert not outbox.exists()


@pytest.mark.parametrize("via", ["option", "env"])
@pytest.mark.parametrize(
    "command",
    [
        ["birthday", "--month", "2025-03"],
        ["status"],
        ["db", "migrate"],
        ["db", "seed", "--users", "5"],
    ],
)
def test_unknown_db_scheme(
    via: str, command: list[str], env: dict[str, str], db_file: Path, outbox: Path
) -> None:
    url = "oracle://app:Sup3rSecret@db.internal:1521/app"
    if via == "option":
        result = invoke("--db", url, *command, env=env)
    else:
        result = invoke(*command, env={**env, "BATCHRUN_DB": url})
    out = assert_clean_failure(result, 2)
    assert len(lines(out)) == 1, out
    assert "'oracle'" in out
    assert "--db" in out
    assert "Sup3rSecret" not in out
    assert not db_file.exists()
    assert not outbox.exists()


@pytest.mark.parametrize("via", ["option", "env"])
def test_unknown_mail_scheme(via: str, env: dict[str, str], db_file: Path, outbox: Path) -> None:
    url = "carrier-pigeon://x"
    if via == "option":
        result = invoke("--mail", url, "birthday", "--month", "2025-03", env=env)
    else:
        result = invoke("birthday", "--month", "2025-03", env={**env, "BATCHRUN_MAIL": url})
    out = assert_clean_failure(result, 2)
    assert len(lines(out)) == 1, out
    assert "'carrier-pigeon'" in out
    assert "--mail" in out
    assert "smtp://" in out  # says what would work
    assert not db_file.exists()
    assert not outbox.exists()


def test_unknown_mail_scheme_checked_before_touching_a_migrated_db(
    env: dict[str, str], outbox: Path, db_file: Path
) -> None:
    migrate_and_seed(env, users=100)
    before = table_digest(env["BATCHRUN_DB"])
    result = invoke("--mail", "carrier-pigeon://x", "birthday", "--month", "2025-03", env=env)
    assert_clean_failure(result, 2)
    assert table_digest(env["BATCHRUN_DB"]) == before
    assert not outbox.exists()


def test_bad_number_in_environment_is_usage_error(env: dict[str, str], db_file: Path) -> None:
    result = invoke("status", env={**env, "BATCHRUN_LEASE_S": "abc"})
    out = assert_clean_failure(result, 2)
    assert "BATCHRUN_LEASE_S" in out
    assert len(lines(out)) == 1, out
    assert not db_file.exists()


def test_non_finite_number_in_environment_is_usage_error(env: dict[str, str]) -> None:
    result = invoke("status", env={**env, "BATCHRUN_MAX_RECEIVES": "nan"})
    assert_clean_failure(result, 2)


# -- fatal errors: exit 1, one line, the hint, no traceback ----------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["birthday", "--month", "2025-03"],
        ["birthday", "--month", "2025-03", "--dry-run"],
        ["status"],
        ["retry"],
        ["db", "seed", "--users", "5"],
        ["db", "explain"],
    ],
)
def test_never_migrated_sqlite_path(
    command: list[str], env: dict[str, str], db_file: Path, outbox: Path
) -> None:
    result = invoke(*command, env=env)
    out = assert_clean_failure(result, 1)
    assert "batchrun db migrate" in out
    assert len(lines(out)) == 1, out
    assert not db_file.exists()  # nothing created by a command that is not `db migrate`
    assert not outbox.exists()


def test_empty_sqlite_file_is_not_migrated(env: dict[str, str], db_file: Path) -> None:
    db_file.touch()
    result = invoke("birthday", "--month", "2025-03", "--json", env=env)
    out = assert_clean_failure(result, 1)
    assert "batchrun db migrate" in out
    # --json still prints the summary of the run that never started, and why
    data = json.loads(result.stdout)
    assert "batchrun db migrate" in data["error"]
    assert (data["job"], data["period"], data["month"]) == ("birthday", "2025-03", "2025-03")
    counts = ("eligible", "cards_created", "emails_sent", "failed", "queued_for_retry")
    assert [data[k] for k in counts] == [0] * len(counts), data


def _drop(db_url: str, table: str) -> None:
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(db_url))
        try:
            conn.execute(f"DROP TABLE {table}")
            conn.commit()
        finally:
            conn.close()
    else:
        query(db_url, f"DROP TABLE {table}")


@pytest.mark.parametrize(
    ("table", "command"),
    [
        ("batchrun_ledger", ["birthday", "--month", "2025-03", "--json"]),
        ("batchrun_schema", ["birthday", "--month", "2025-03", "--json"]),
        ("batchrun_ledger", ["status", "--month", "2025-03"]),
        ("batchrun_queue", ["status", "--month", "2025-03"]),
        ("batchrun_schema", ["status", "--month", "2025-03"]),
        ("batchrun_queue", ["retry"]),
        ("batchrun_suppression", ["birthday", "--month", "2025-03", "--json"]),
        ("batchrun_suppression", ["suppress", "list"]),
    ],
)
def test_dropped_batchrun_table(
    table: str, command: list[str], db_url: str, env: dict[str, str], outbox: Path
) -> None:
    env = {**env, "BATCHRUN_DB": db_url}
    migrate_and_seed(env, users=200)
    _drop(db_url, table)
    result = invoke(*command, env=env)
    out = assert_clean_failure(result, 1)
    assert "batchrun db migrate" in out
    assert len(lines(ANSI.sub("", result.stderr))) == 1, out
    if "--json" in command:  # and the run's JSON, with the same error
        assert "batchrun db migrate" in json.loads(result.stdout)["error"]
    else:
        assert result.stdout == "", out
    assert outbox_files(outbox) == []


@pytest.mark.parametrize("table", ["batchrun_ledger", "batchrun_queue"])
def test_migrate_repairs_a_dropped_batchrun_table(
    table: str, db_url: str, env: dict[str, str]
) -> None:
    env = {**env, "BATCHRUN_DB": db_url}
    migrate_and_seed(env, users=200)
    _drop(db_url, table)
    result = invoke("db", "migrate", env=env)
    assert result.exit_code == 0, text(result)
    result = invoke("status", "--month", "2025-03", "--json", env=env)
    assert result.exit_code == 0, text(result)


def test_unreachable_mysql_hides_password(env: dict[str, str], db_file: Path) -> None:
    url = "mysql://root:s3cretpw@127.0.0.1:1/x"
    for verbose in ([], ["-v"]):
        result = invoke(*verbose, "--db", url, "birthday", "--month", "2025-03", env=env)
        assert result.exit_code == 1, text(result)
        assert result.exception is None or isinstance(result.exception, SystemExit)
        for stream in (result.output, result.stdout, result.stderr):
            assert "s3cretpw" not in stream
        if not verbose:
            out = text(result)
            assert len(lines(out)) == 1, out
            assert "Traceback" not in out
            assert "127.0.0.1" in out
            assert "root:***@" in out
    assert not db_file.exists()


def test_unreachable_mysql_hides_password_with_at_sign(env: dict[str, str]) -> None:
    result = invoke("--db", "mysql://root:pw@hunter2x@127.0.0.1:1/x", "status", env=env)
    assert result.exit_code == 1, text(result)
    assert "hunter2x" not in result.output


def test_mysql_url_without_database(env: dict[str, str]) -> None:
    result = invoke("--db", "mysql://root:s3cretpw@127.0.0.1:1/", "status", env=env)
    out = assert_clean_failure(result, 2)
    assert "names no database" in out
    assert "s3cretpw" not in result.output


# -- the happy path --------------------------------------------------------------------------


def test_happy_path_on_sqlite(env: dict[str, str], outbox: Path) -> None:
    db_url = env["BATCHRUN_DB"]
    migrate_and_seed(env, users=600, seed=3)
    assert query(db_url, "SELECT COUNT(*) FROM user") == [(600,)]
    expected = eligible_ids(db_url, 3)
    bad = invalid_ids(db_url, 3)
    assert len(expected) > 20

    result = invoke("birthday", "--month", "2025-03", "--json", env=env)
    assert result.exit_code == 0, text(result)
    summary = json.loads(result.stdout)  # stdout holds the JSON object and nothing else
    assert set(summary) >= BIRTHDAY_KEYS
    assert summary["job"] == "birthday"
    assert summary["month"] == "2025-03"
    assert summary["dry_run"] is False
    assert summary["eligible"] == len(expected)
    assert summary["skipped"] == len(bad)
    sent = len(expected) - len(bad)
    assert summary["emails_sent"] == sent
    assert summary["emails_sent"] == summary["eligible"] - summary["skipped"]
    assert summary["cards_created"] == sent
    assert len(outbox_files(outbox)) == summary["emails_sent"]
    assert summary["failed"] == summary["queued_for_retry"] == summary["dead_lettered"] == 0
    assert isinstance(summary["duration_s"], int | float)
    assert summary["duration_s"] >= 0
    names = {p.name for p in outbox_files(outbox)}
    assert names == {f"birthday.2025.{uid}@example.com.eml" for uid in expected - bad}

    # A second run of the same month creates and sends nothing.
    cards_before = table_digest(db_url, ["gift_card"])
    mail_before = outbox_digest(outbox)
    again = invoke("birthday", "--month", "2025-03", "--json", env=env)
    assert again.exit_code == 0, text(again)
    second = json.loads(again.stdout)
    assert second["cards_created"] == 0
    assert second["emails_sent"] == 0
    assert second["failed"] == 0
    assert table_digest(db_url, ["gift_card"]) == cards_before
    assert outbox_digest(outbox) == mail_before

    status = invoke("status", "--month", "2025-03", "--json", env=env)
    assert status.exit_code == 0, text(status)
    counts = json.loads(status.stdout)
    assert set(counts) >= STATUS_KEYS
    assert counts["month"] == "2025-03"
    assert counts["cards"] == sent
    assert counts["emails_sent"] == sent
    assert counts["succeeded"] == sent  # every job's key too, as operations.md lists it
    table = invoke("status", "--month", "2025-03", env=env).stdout.splitlines()
    rows = {line.split("  ")[0] for line in table}
    assert "emails sent" in rows and "succeeded" not in rows, table  # the same count once
    assert counts["pending"] == 0
    assert counts["skipped"] == len(bad)
    assert counts["failed_permanent"] == 0
    assert counts["retry_queue_depth"] == 0
    assert counts["dead_letter_depth"] == 0

    # Another month is still untouched.
    other = invoke("status", "--month", "2025-04", "--json", env=env)
    assert other.exit_code == 0, text(other)
    other_counts = json.loads(other.stdout)
    assert other_counts["cards"] == 0
    assert other_counts["pending"] == len(eligible_ids(db_url, 4))

    users_before = table_digest(db_url, ["user"])
    refused = invoke("db", "seed", "--users", "10", env=env)
    out = assert_clean_failure(refused, 1)
    assert "--force" in out
    assert len(lines(out)) == 1, out
    assert table_digest(db_url, ["user"]) == users_before
    forced = invoke("db", "seed", "--users", "10", "--force", env=env)
    assert forced.exit_code == 0, text(forced)
    assert query(db_url, "SELECT COUNT(*) FROM user") == [(610,)]


def test_table_output_without_json(env: dict[str, str], outbox: Path) -> None:
    migrate_and_seed(env, users=300, seed=5)
    sent = len(eligible_ids(env["BATCHRUN_DB"], 7)) - len(invalid_ids(env["BATCHRUN_DB"], 7))
    result = invoke("birthday", "--month", "2025-07", env=env)
    assert result.exit_code == 0, text(result)
    out = ANSI.sub("", result.stdout)
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    assert "2025-07" in out
    row = [line for line in out.splitlines() if "emails sent" in line]
    assert len(row) == 1, out
    assert re.search(rf"\b{sent}\b", row[0]), row[0]
    assert "eligible" in out
    assert len(outbox_files(outbox)) == sent
    status = invoke("status", "--month", "2025-07", env=env)
    assert status.exit_code == 0, text(status)
    assert "pending" in status.stdout
    assert "emails sent" in status.stdout


def test_dry_run_before_any_run(env: dict[str, str], outbox: Path) -> None:
    db_url = env["BATCHRUN_DB"]
    migrate_and_seed(env, users=600, seed=3)
    # The month with the most invalid addresses, so `skipped` is really counted.
    month = max(range(1, 13), key=lambda m: (len(invalid_ids(db_url, m)), -m))
    bad = invalid_ids(db_url, month)
    expected = eligible_ids(db_url, month)
    assert bad, "the demo seed has a few invalid addresses"
    before = table_digest(db_url)

    result = invoke("birthday", "--month", f"2025-{month:02d}", "--dry-run", "--json", env=env)
    assert result.exit_code == 0, text(result)
    summary = json.loads(result.stdout)
    assert set(summary) >= BIRTHDAY_KEYS
    assert summary["dry_run"] is True
    assert summary["eligible"] == len(expected)
    assert summary["skipped"] == len(bad)
    assert summary["cards_created"] == 0
    assert summary["emails_sent"] == 0
    assert summary["queued_for_retry"] == 0
    assert table_digest(db_url) == before
    assert not outbox.exists()

    status = invoke("status", "--month", f"2025-{month:02d}", "--json", env=env)
    assert json.loads(status.stdout)["pending"] == len(expected)


def test_limit_caps_the_run(env: dict[str, str], outbox: Path) -> None:
    migrate_and_seed(env, users=600, seed=3)
    result = invoke(
        "birthday", "--month", "2025-03", "--limit", "5", "--page-size", "2", "--json", env=env
    )
    assert result.exit_code == 0, text(result)
    summary = json.loads(result.stdout)
    assert summary["eligible"] == 5
    assert len(outbox_files(outbox)) == summary["emails_sent"] <= 5
    status = json.loads(invoke("status", "--month", "2025-03", "--json", env=env).stdout)
    assert status["pending"] == len(eligible_ids(env["BATCHRUN_DB"], 3)) - 5


def test_explain_names_the_index(env: dict[str, str]) -> None:
    migrate_and_seed(env, users=200)
    result = invoke("db", "explain", "--month", "2025-06", env=env)
    assert result.exit_code == 0, text(result)
    assert "idx_user_birth_month_status_id" in result.stdout


def test_migrate_twice_via_cli(env: dict[str, str]) -> None:
    first = invoke("db", "migrate", env=env)
    assert first.exit_code == 0, text(first)
    before = table_digest(env["BATCHRUN_DB"])
    second = invoke("db", "migrate", env=env)
    assert second.exit_code == 0, text(second)
    assert "up to date" in text(second)
    assert table_digest(env["BATCHRUN_DB"]) == before


# -- help ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ([], ["--db", "--mail", "--retry-queue", "--from", "birthday", "retry", "status", "db"]),
        (["db"], ["migrate", "seed", "explain"]),
        (["db", "migrate"], []),
        (["db", "seed"], ["--users", "--seed", "--force"]),
        (["db", "explain"], ["--month"]),
        (
            ["birthday"],
            ["--month", "--dry-run", "--concurrency", "--rate", "--page-size", "--limit", "--json"],
        ),
        (["retry"], ["--max", "--concurrency", "--json"]),
        (["status"], ["--month", "--json"]),
    ],
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(
    command: list[str], options: list[str], flag: str, env: dict[str, str], db_file: Path
) -> None:
    result = invoke(*command, flag, env=env)
    out = text(result)
    assert result.exit_code == 0, out
    assert "Usage" in out
    for option in options:
        assert option in out, option
    assert not db_file.exists()


def test_version_prints_and_exits_0() -> None:
    result = run_cli("--version", env={})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"batchrun {batchrun.__version__}"


def test_a_global_option_after_the_command_works_as_before_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'after.db'}"
    base = {k: v for k, v in env.items() if k != "BATCHRUN_DB"}
    assert run_cli("db", "migrate", "--db", url, env=base).returncode == 0
    after = run_cli("status", "--month", "2025-03", "--json", "--db", url, env=base)
    before = run_cli("--db", url, "status", "--month", "2025-03", "--json", env=base)
    assert after.returncode == before.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert (tmp_path / "after.db").exists()
    verbose = run_cli("status", "--month", "2025-03", "-v", "--db", url, env=base)
    assert verbose.returncode == 0, verbose.stderr


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("import no_such_module_anywhere\n", "cannot import"),
        ("import batchrun\n\nclass J(batchrun.Job):\n    name = 'Bad Name'\n", "Bad Name"),
        (
            "import batchrun\n\nclass J(batchrun.Job):\n    name = 'nopage'\n\n"
            "    async def process(self, ctx, row):\n        pass\n",
            "page",
        ),
    ],
    ids=["import-error", "bad-name", "missing-page"],
)
def test_a_broken_job_module_exits_2_with_one_line_naming_it(
    tmp_path: Path, env: dict[str, str], source: str, names: str
) -> None:
    job_file = tmp_path / "broken_job.py"
    job_file.write_text(source)
    result = run_cli("--jobs", str(job_file), "jobs", env=env)
    assert result.returncode == 2, result.stderr
    shown = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(shown) == 1, result.stderr
    assert "broken_job.py" in shown[0] and names in shown[0], shown[0]
    assert "Traceback" not in result.stderr


def test_two_jobs_with_one_name_exit_2(tmp_path: Path, env: dict[str, str]) -> None:
    body = (
        "import batchrun\n\nclass J(batchrun.Job):\n    name = 'twin'\n\n"
        "    async def page(self, ctx, after, limit):\n        return []\n\n"
        "    async def process(self, ctx, row):\n        pass\n"
    )
    (tmp_path / "one.py").write_text(body)
    (tmp_path / "two.py").write_text(body)
    spec = f"{tmp_path / 'one.py'},{tmp_path / 'two.py'}"
    result = run_cli("--jobs", spec, "jobs", "--json", env=env)
    assert result.returncode == 2, result.stderr
    assert "twin" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["birthday"], ["run"], ["retry"], ["status"], ["jobs"]])
def test_help_shows_flags_without_a_bool_value(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    flag_lines = [line for line in result.output.splitlines() if "--json" in line]
    assert flag_lines and all("<bool>" not in line for line in flag_lines), flag_lines
    # Not even --help / -h, the option typer builds itself: no page shows a <bool> at all.
    assert "<bool>" not in result.output, result.output


@pytest.mark.parametrize(
    "command", [[], ["db"], ["db", "migrate"], ["suppress", "add"], ["worker"]]
)
def test_no_help_page_shows_a_bool_value(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "--help" in result.output and "<bool>" not in result.output, result.output


def test_a_dry_run_of_a_month_begun_counts_what_is_left(env: dict[str, str]) -> None:
    """After a run with --limit, the dry run stopped at the first page holding a finished
    entity: it said 0 eligible while status said the rest was pending."""
    migrate_and_seed(env, users=3000, seed=3)
    first = invoke("birthday", "--month", "2025-06", "--limit", "60", "--page-size", "50", env=env)
    assert first.exit_code == 0, text(first)
    status = invoke("status", "--month", "2025-06", "--json", env=env)
    pending = json.loads(status.stdout)["pending"]
    assert pending > 0
    dry = invoke(
        "birthday", "--month", "2025-06", "--dry-run", "--json", "--page-size", "50", env=env
    )
    assert dry.exit_code == 0, text(dry)
    assert json.loads(dry.stdout)["eligible"] == pending

"""Output that tells the truth: counts that add up, checked against the ledger,
and output that stays whole when stdout or stderr is a pipe, at 40 columns as at 300.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.birthday import eligible_ids
from support.cli import invoke, migrate_and_seed, run_cli, text
from support.db import query
from support.smtp_server import SmtpTestServer, fail_recipients

from batchrun.cli import app
from batchrun.cli.conventions import commands_without_examples, plain_lines
from batchrun.unsubscribe import Signer

pytestmark = pytest.mark.usefixtures("restore_root_logger")

BOX = re.compile(r"[\u2500-\u257f]")  # box drawing
LONG = "a.very.long.local.part.that.goes.on.and.on@a-very-long-domain-name.example.com"


def ledger_states(db_url: str, job: str, period: str) -> dict[int, int]:
    rows = query(
        db_url,
        "SELECT state, COUNT(*) FROM batchrun_ledger WHERE job = %s AND period = %s GROUP BY state",
        job,
        period,
    )
    return {int(state): int(count) for state, count in rows}


# -- counts -----------------------------------------------------------------------------------


def test_retry_processed_is_succeeded_plus_skipped_plus_failed(env: dict[str, str]) -> None:
    """Two users fail temporarily; one is suppressed before the retry: it is skipped."""
    migrate_and_seed(env, users=300, seed=5)
    db = env["BATCHRUN_DB"]
    victims = sorted(eligible_ids(db, 7))[:3]
    emails = [query(db, "SELECT email FROM user WHERE id = %s", uid)[0][0] for uid in victims]
    with SmtpTestServer(policy=fail_recipients({e: "451 4.3.0 later" for e in emails})) as smtp:
        first = invoke("birthday", "--month", "2025-07", env={**env, "BATCHRUN_MAIL": smtp.url})
    assert first.exit_code == 3, text(first)
    assert invoke("suppress", "add", emails[0], env=env).exit_code == 0
    with SmtpTestServer() as smtp:
        drained = invoke("retry", "--json", env={**env, "BATCHRUN_MAIL": smtp.url})
    data = json.loads(drained.stdout)
    assert (
        data["processed"] == data["succeeded"] + data["skipped"] + data["failed"] + data["poison"]
    ), data
    assert (data["processed"], data["succeeded"], data["skipped"]) == (3, 2, 1), data
    states = ledger_states(db, "birthday", "2025-07")
    assert states.get(3, 0) == 0 and states.get(2, 0) >= 1, states  # none left retrying
    table = invoke("retry", env=env)
    assert "skipped" in table.stdout, table.stdout


def test_status_lists_50_and_counts_the_rest(env: dict[str, str]) -> None:
    """More than 50 entities not done: "… and N more" is the ledger's count minus 50."""
    migrate_and_seed(env, users=2000, seed=5)
    db = env["BATCHRUN_DB"]
    june = sorted(eligible_ids(db, 6))
    for uid in june[:70]:
        (email,) = query(db, "SELECT email FROM user WHERE id = %s", uid)[0]
        assert invoke("suppress", "add", str(email), env=env).exit_code == 0
    assert invoke("birthday", "--month", "2025-06", env=env).exit_code == 0
    states = ledger_states(db, "birthday", "2025-06")
    not_done = states.get(2, 0) + states.get(3, 0) + states.get(4, 0)
    assert not_done >= 70, states
    data = json.loads(invoke("status", "--month", "2025-06", "--json", env=env).stdout)
    assert len(data["problems"]) == 50 and data["problems_not_listed"] == not_done - 50, data
    shown = invoke("status", "--month", "2025-06", env=env).stdout
    assert f"… and {not_done - 50} more" in shown, shown
    every = json.loads(invoke("status", "--month", "2025-06", "--all", "--json", env=env).stdout)
    assert len(every["problems"]) == not_done and every["problems_not_listed"] == 0


def test_a_limited_run_says_the_periods_total_not_a_second_eligible(env: dict[str, str]) -> None:
    migrate_and_seed(env, users=600, seed=3)
    total = len(eligible_ids(env["BATCHRUN_DB"], 3))
    result = invoke("birthday", "--month", "2025-03", "--limit", "5", env=env)
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.splitlines()[1:])
    assert rows["eligible"] == "5", result.stdout
    assert f"done 5 of the period's {total} (5 in this run)" in result.stderr
    assert "eligible" not in result.stderr, "one word, one meaning: the table's eligible"
    assert ledger_states(env["BATCHRUN_DB"], "birthday", "2025-03").get(1, 0) == 5


def test_a_user_job_status_has_a_pending_row(env: dict[str, str], tmp_path: Path) -> None:
    """renewal has no status of its own: batchrun pages it and counts what is not done."""
    jobs = str(ROOT / "examples" / "renewal" / "renewal.py")
    renewal = {**env, "BATCHRUN_JOBS": jobs, "BATCHRUN_DB": f"sqlite:///{tmp_path / 'r.db'}"}
    assert invoke("db", "migrate", env=renewal).exit_code == 0
    db = renewal["BATCHRUN_DB"]
    for n in range(1, 13):
        query(
            db,
            "INSERT INTO account (contact, name, renews_on, active) VALUES (%s, %s, %s, 1)",
            f"c{n}@example.com" if n != 3 else None,
            f"C{n}",
            "2025-06-08",
        )
    before = json.loads(
        invoke("status", "renewal", "--period", "2025-06-01", "--json", env=renewal).stdout
    )
    assert before["pending"] == 12, before
    run = invoke("run", "renewal", "--period", "2025-06-01", "--limit", "5", env=renewal)
    assert run.exit_code == 0, text(run)
    after = json.loads(
        invoke("status", "renewal", "--period", "2025-06-01", "--json", env=renewal).stdout
    )
    states = ledger_states(db, "renewal", "2025-06-01")
    assert after["pending"] == 12 - sum(states.get(s, 0) for s in (1, 2, 4)) == 7, (after, states)
    assert "pending" in invoke("status", "renewal", "--period", "2025-06-01", env=renewal).stdout


# -- piped output -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("columns", [40, 300])
def test_piped_output_is_plain_and_whole(columns: int, tmp_path: Path) -> None:
    env = {
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'p.db'}",
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_JOBS": str(ROOT / "examples" / "renewal" / "renewal.py"),
        "COLUMNS": str(columns),
        "NO_COLOR": "1",
    }
    assert run_cli("db", "migrate", env=env).returncode == 0
    seeded = run_cli("db", "seed", "--users", "300", "--force", env=env)
    assert seeded.returncode == 0, seeded.stderr
    ids_line = next(line for line in seeded.stderr.splitlines() if line.startswith("eligible ids"))
    assert len(ids_line) > 80 and "12: " in ids_line, "stderr: one line, however long"
    assert run_cli("suppress", "add", LONG, env=env).returncode == 0
    listed = run_cli("suppress", "list", env=env).stdout
    jobs = run_cli("jobs", env=env).stdout
    summary = run_cli("birthday", "--month", "2025-06", env=env)
    for out in (listed, jobs, summary.stdout):
        assert not BOX.search(out), out
    assert any(LONG in line and "manual" in line for line in listed.splitlines()), listed
    assert str(ROOT / "examples" / "renewal" / "renewal.py") in jobs, jobs
    assert re.search(r"^emails sent +\d+$", summary.stdout, re.M), summary.stdout
    assert all("…" not in line for line in listed.splitlines() + jobs.splitlines())


def test_plain_lines_align_without_cutting() -> None:
    lines = plain_lines(("a", "bb"), [("x" * 50, 1), ("y", 22)])
    assert lines == ["a" + " " * 49 + "  bb", "x" * 50 + "  1", "y" + " " * 49 + "  22"]


def test_every_command_has_examples_and_plain_metavars() -> None:
    assert commands_without_examples(app) == []
    for command in ("run", "retry", "status", "submit", "db explain", "suppress add"):
        out = run_cli(*command.split(), "--help", env={"COLUMNS": "200"}).stdout
        assert "Examples:" in out, out
        for bad in ("<str>", "<int", "<list", "x>=1", "[default: ("):
            assert bad not in out, (command, bad, out)
    assert "--db" in (top := run_cli("--help", env={"COLUMNS": "200"}).stdout)
    assert re.search(r"--db +URL", top) and "[default: sqlite:///batchrun.db]" in top, top
    assert run_cli("-V", env={}).stdout.startswith("batchrun ")
    assert "--install-completion" in top


def test_an_unknown_job_says_did_you_mean_and_jobs(env: dict[str, str]) -> None:
    result = invoke("run", "birthdya", env=env)
    assert result.exit_code == 2, text(result)
    line = text(result).strip()
    assert "did you mean 'birthday'?" in line and "--jobs" in line, line
    assert len(line.splitlines()) == 1


def test_an_error_prints_once_with_v(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "notadir").write_text("")
    broken = {**env, "BATCHRUN_MAIL": f"file://{tmp_path / 'notadir'}"}
    migrate_and_seed(env, users=50)
    result = invoke("-v", "birthday", "--month", "2025-06", env=broken)
    assert result.exit_code == 1
    assert text(result).count("cannot write to") == 1, text(result)
    # A mail server down at the start is no error (exit 3, the month handed on to the retry
    # queue): stderr says its cause once too, the log line at -v naming none (the summary
    # table on stdout shows it as `stopped`).
    down = {**env, "BATCHRUN_MAIL": "smtp://127.0.0.1:1"}
    result = invoke("-v", "birthday", "--month", "2025-06", env=down)
    assert result.exit_code == 3
    assert result.stderr.count("cannot connect") == 1, result.stderr


def test_verbose_logs_one_line_per_page(env: dict[str, str]) -> None:
    migrate_and_seed(env, users=600, seed=3)
    total = len(eligible_ids(env["BATCHRUN_DB"], 3))
    result = run_cli("-v", "birthday", "--month", "2025-03", "--page-size", "10", env=env)
    pages = [line for line in result.stderr.splitlines() if ": page after id " in line]
    assert len(pages) == -(-total // 10), result.stderr
    assert sum(int(re.search(r"(\d+) claimed", p)[1]) for p in pages) == total  # type: ignore[index]
    assert any(": started (" in line for line in result.stderr.splitlines())
    assert any(": finished: " in line for line in result.stderr.splitlines())


def test_db_explain_any_job_ok_then_slow(db_url: str) -> None:
    """renewal's page query, explained on each database: its index, then without it."""
    env = {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_JOBS": str(ROOT / "examples" / "renewal" / "renewal.py"),
    }
    assert invoke("db", "migrate", env=env).exit_code == 0
    for n in range(200):
        query(
            db_url,
            "INSERT INTO account (contact, name, renews_on, active) VALUES (%s, %s, %s, 1)",
            f"c{n}@example.com",
            f"C{n}",
            f"2025-06-{n % 28 + 1:02d}",
        )
    if db_url.startswith("postgres"):  # it reads a table of a few pages whole: make it bigger
        query(
            db_url,
            "INSERT INTO account (contact, name, renews_on, active) SELECT 'x' || g, 'X', "
            "DATE '2025-07-01' + (g % 300), 1 FROM generate_series(1, 30000) AS g",
        )
        query(db_url, "ANALYZE account")
    args = ("db", "explain", "renewal", "--period", "2025-06-01")
    good = invoke(*args, "--json", env=env)
    assert good.exit_code == 0, text(good)
    data = json.loads(good.stdout)
    assert "through idx_account_renews_on_active_id" in data["verdict"], data
    # PostgreSQL may take a few hundred rows through a bitmap and sort them: its choice.
    assert data["ok"] or db_url.startswith("postgres"), data
    assert data["queries"] and "FROM account" in data["queries"][0]["sql"], data
    on = "" if db_url.startswith(("sqlite", "postgres")) else " ON account"
    query(db_url, f"DROP INDEX idx_account_renews_on_active_id{on}")
    slow = invoke(*args, env=env)
    assert slow.exit_code == 0, text(slow)
    assert slow.stdout.startswith("slow: renewal's page query "), slow.stdout


def test_json_on_preview_suppress_and_unsubscribe(env: dict[str, str]) -> None:
    migrate_and_seed(env, users=100, seed=1)
    shown = invoke("preview", "birthday", "--period", "2025-06", "--id", "39", "--json", env=env)
    assert shown.exit_code == 0, text(shown)
    mail = json.loads(shown.stdout)
    assert (mail["job"], mail["period"], mail["id"]) == ("birthday", "2025-06", 39)
    assert mail["message_id"] == "<birthday.2025.39@example.com>" and mail["html"], mail
    assert mail["text"] and mail["headers"]["Subject"] == mail["subject"]
    missing = invoke("preview", "birthday", "--period", "2025-06", "--id", "40", env=env)
    assert missing.exit_code == 2 and "ids it returns: 39, " in text(missing), text(missing)

    added = json.loads(invoke("suppress", "add", "Ann@Example.COM", "--json", env=env).stdout)
    assert (added["address"], added["reason"], added["added"]) == (
        "ann@example.com",  # the one address key: case-folded
        "manual",
        True,
    )
    again = json.loads(invoke("suppress", "add", "Ann@EXAMPLE.com", "--json", env=env).stdout)
    assert again["added"] is False
    gone = json.loads(invoke("suppress", "remove", "Ann@example.com", "--json", env=env).stdout)
    assert gone == {"address": "ann@example.com", "removed": True}

    secret = "a-secret-of-at-least-16-chars"
    base = "https://example.com/unsubscribe"
    signed = {**env, "BATCHRUN_UNSUBSCRIBE_URL": base, "BATCHRUN_UNSUBSCRIBE_SECRET": secret}
    url = Signer(secret, base).url("birthday", "bob@example.com")
    done = invoke("unsubscribe", url, "--json", env=signed)
    assert done.exit_code == 0, text(done)
    assert json.loads(done.stdout) == {
        "address": "bob@example.com",
        "job": "birthday",
        "added": True,
    }


def test_batchrun_brand_names_the_sender_in_the_email_and_the_from_name_otherwise(
    env: dict[str, str],
) -> None:
    migrate_and_seed(env, users=100, seed=1)
    acme = {**env, "BATCHRUN_FROM": "Acme Gifts <gifts@example.com>"}

    def preview(environ: dict[str, str]) -> dict[str, Any]:
        shown = invoke(
            "preview", "birthday", "--period", "2025-06", "--id", "39", "--json", env=environ
        )
        assert shown.exit_code == 0, text(shown)
        return dict(json.loads(shown.stdout))

    by_from = preview(acme)
    assert "everyone at Acme Gifts wishes" in by_from["text"], by_from["text"]
    assert "&copy; " in by_from["html"] and "Acme Gifts</p>" in by_from["html"]

    branded = preview({**acme, "BATCHRUN_BRAND": "Zephyr & Co"})
    assert "everyone at Zephyr & Co wishes" in branded["text"], branded["text"]
    assert "everyone at Zephyr &amp; Co wishes" in branded["html"]  # escaped in HTML only
    assert "Acme Gifts" not in branded["text"] + branded["html"]
    assert branded["headers"]["From"] == "Acme Gifts <gifts@example.com>"  # the From stays

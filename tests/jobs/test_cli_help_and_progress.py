"""The first ten minutes: help that reads as written, a summary without the zero
rows nobody asked about (the JSON keeps them), a labelled progress bar whose total the
stopped run's closing line repeats, and ``db explain``'s one-line verdict.
"""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import typer
from support import ROOT
from support.birthday import eligible_ids
from support.cli import ANSI, invoke, migrate_and_seed, run_cli, text
from support.db import query
from support.smtp_server import SmtpTestServer, fail_recipients

from batchrun.cli import app
from batchrun.cli.conventions import reflow
from batchrun.jobs.birthday.explain import INDEX, verdict

pytestmark = pytest.mark.usefixtures("restore_root_logger")

# -- help ------------------------------------------------------------------------------------

# A sentence of the help that must stay on one line (not "… done,⏎ 3 when⏎ some failed …").
SENTENCE = "Exit 0 when every user is done, 3 when some failed and wait in the retry queue"


def help_text(*command: str, columns: int) -> str:
    """``--help`` as a terminal ``columns`` wide shows it (a process of its own: in-process,
    the width of an earlier call sticks)."""
    result = run_cli(
        *command, "--help", env={"COLUMNS": str(columns), "TERMINAL_WIDTH": str(columns)}
    )
    assert result.returncode == 0, result.stderr
    return ANSI.sub("", result.stdout)


def description(out: str) -> list[list[str]]:
    """The help's description paragraphs (between Usage and the first panel), as lines."""
    body = out.split("Usage:", 1)[1].split("\n", 1)[1].split("╭", 1)[0]
    paragraphs: list[list[str]] = [[]]
    for line in body.splitlines():
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def test_the_sentence_from_the_issue_is_one_line_on_a_wide_terminal() -> None:
    out = help_text("birthday", columns=250)
    assert any(SENTENCE in line for line in out.splitlines()), out


@pytest.mark.parametrize("command", [["birthday"], ["worker"], ["retry"], ["run"], ["submit"]])
def test_help_wraps_only_at_the_terminal_width(command: list[str]) -> None:
    """Every line of a paragraph but its last is full: the next word would not have fit."""
    width = 80
    out = help_text(*command, columns=width)
    paragraphs = description(out)
    assert len(paragraphs) >= 2, out
    for lines in paragraphs:
        for line, following in itertools.pairwise(lines):
            next_word = following.split()[0]
            assert len(line) + 1 + len(next_word) > width - 4, f"{line!r} / {following!r}"
    assert SENTENCE in " ".join(" ".join(p) for p in description(help_text("birthday", columns=80)))


def _commands(group: Any, path: str = "batchrun") -> list[tuple[str, Any]]:
    """Every command under ``group`` (typer's own click, not necessarily ``click``'s)."""
    found = [(path, group)]
    for name, command in getattr(group, "commands", {}).items():
        found += _commands(command, f"{path} {name}")
    return found


def test_no_command_help_keeps_a_docstring_line_break() -> None:
    """Commands added later are reflowed too: no single newline inside a paragraph."""
    commands = _commands(typer.main.get_command(app))
    assert {"batchrun birthday", "batchrun db explain", "batchrun worker"} <= dict(commands).keys()
    for path, command in commands:
        for paragraph in (command.help or "").split("\n\n"):
            if not paragraph.startswith("\b"):
                assert "\n" not in paragraph, (path, paragraph)


def test_reflow_joins_lines_and_keeps_marked_blocks() -> None:
    doc = """First line
    goes on.

    Second
      paragraph.

    \b
    kept: one
    kept: two
    """
    assert reflow(doc) == "First line goes on.\n\nSecond paragraph.\n\n\b\nkept: one\nkept: two"


# -- the summary table -----------------------------------------------------------------------

ZERO_ROWS = ("not queued", "left pending", "lost claims", "continuation", "throttles")


def rows_of(out: str) -> dict[str, str]:
    """``name -> value`` of a two-column table (plain columns: stdout is not a terminal)."""
    found = {}
    for line in ANSI.sub("", out).splitlines():
        cells = [c.strip() for c in re.split(r"\s{2,}", line) if c.strip()]
        if len(cells) == 2:
            found[cells[0]] = cells[1]
    return found


def test_the_summary_hides_zero_rows_and_the_json_keeps_every_key(
    tmp_path: Path, env: dict[str, str]
) -> None:
    migrate_and_seed(env, users=300, seed=5)
    done = invoke("birthday", "--month", "2025-07", env=env)
    assert done.exit_code == 0, text(done)
    rows = rows_of(done.stdout)
    for name in ("eligible", "succeeded", "skipped", "failed", "emails sent", "cards created"):
        assert name in rows, (name, done.stdout)
    for name in (*ZERO_ROWS, "queued for retry", "dead lettered"):
        assert name not in rows, (name, done.stdout)
    again = invoke("birthday", "--month", "2025-07", "--json", env=env)
    data = json.loads(again.stdout)
    for key in ("not_queued", "left_pending", "lost_claims", "continuation", "throttles"):
        assert key in data and data[key] in (0, False), key
    assert set(rows_of(invoke("birthday", "--month", "2025-07", env=env).stdout)) >= {
        "eligible",
        "emails sent",
    }


def test_a_row_that_is_not_zero_is_shown(env: dict[str, str]) -> None:
    """One temporary failure: ``queued for retry 1`` appears, the other zero rows do not."""
    migrate_and_seed(env, users=300, seed=5)
    (email,) = query(
        env["BATCHRUN_DB"],
        "SELECT email FROM user WHERE id = %s",
        min(eligible_ids(env["BATCHRUN_DB"], 7)),
    )[0]
    with SmtpTestServer(policy=fail_recipients({email: "451 4.3.0 try again later"})) as smtp:
        result = invoke("birthday", "--month", "2025-07", env={**env, "BATCHRUN_MAIL": smtp.url})
    assert result.exit_code == 3, text(result)
    rows = rows_of(result.stdout)
    assert rows.get("queued for retry") == "1", result.stdout
    assert not set(ZERO_ROWS) & set(rows), result.stdout
    retry = invoke("retry", env=env)
    assert {"processed", "succeeded", "failed"} <= set(rows_of(retry.stdout)), retry.stdout
    assert "requeued" not in rows_of(retry.stdout)


# -- how much of the month is done -----------------------------------------------------------


def test_a_limited_run_says_how_much_of_the_month_is_done(env: dict[str, str]) -> None:
    migrate_and_seed(env, users=600, seed=3)
    total = len(eligible_ids(env["BATCHRUN_DB"], 3))
    first = invoke("birthday", "--month", "2025-03", "--limit", "5", env=env)
    assert first.exit_code == 0, text(first)
    said = f"done 5 of the period's {total} (5 in this run); {total - 5} still to do"
    assert said in first.stderr
    second = invoke("birthday", "--month", "2025-03", "--limit", "4", env=env)
    assert f"done 9 of the period's {total} (4 in this run, 5 by earlier runs)" in second.stderr
    rest = invoke("birthday", "--month", "2025-03", env=env)
    assert rest.exit_code == 0, text(rest)
    assert "still to do" not in rest.stderr  # the month is done: nothing to say
    quiet = invoke("birthday", "--month", "2025-03", "--limit", "5", "--json", env=env)
    assert "done" not in quiet.stderr and json.loads(quiet.stdout)["eligible"] == 0


def run_on_a_terminal(args: list[str], env: dict[str, str], stop_after: SmtpTestServer) -> str:
    """The CLI with stderr on a pseudo-terminal (so the bar shows); SIGINT once 10 emails
    arrived. Returns what the terminal showed, ANSI codes removed."""
    main, child = pty.openpty()
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env, TERM="xterm-256color", COLUMNS="160", PYTHONPATH=str(ROOT))
    full.pop("NO_COLOR", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "batchrun", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=child,
        env=full,
        cwd=ROOT,
    )
    os.close(child)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stop_after.wait_for_messages(10, timeout=60)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    os.close(main)
    assert process.returncode == 130, seen.decode(errors="replace")
    screen = ANSI.sub("", seen.decode(errors="replace").replace("\r", "\n"))
    return screen + "\n" + out.decode()


@pytest.mark.slow
def test_an_interrupted_run_names_the_bars_total(
    env: dict[str, str], smtp_server: SmtpTestServer
) -> None:
    migrate_and_seed(env, users=600, seed=3)
    total = len(eligible_ids(env["BATCHRUN_DB"], 3))
    smtp_server.set_latency(0.1)
    screen = run_on_a_terminal(
        ["birthday", "--month", "2025-03", "--concurrency", "1"],
        {**env, "BATCHRUN_MAIL": smtp_server.url},
        smtp_server,
    )
    bars = [line for line in screen.splitlines() if "elapsed" in line and "remaining" in line]
    assert bars, screen
    totals = {int(m[1]) for line in bars for m in re.finditer(r"\b\d+/(\d+)\b", line)}
    assert totals == {total}, bars[-3:]
    done = re.search(rf"done (\d+) of the period's {total} \(\1 in this run\)", screen)
    assert done, screen[-2000:]
    worked = int(done[1])
    assert 10 <= worked < total
    assert f"{total - worked} still to do" in screen
    assert "stopped (" in screen


# -- db explain ------------------------------------------------------------------------------


def test_explain_says_in_one_line_which_index_and_rows_per_page(db_url: str) -> None:
    env = {"BATCHRUN_DB": db_url}
    # PostgreSQL reads a table of a few pages whole, whatever the index: give it a month
    # of more than a page.
    migrate_and_seed(env, users=20_000 if db_url.startswith("postgres") else 300)
    if db_url.startswith("postgres"):  # the statistics autovacuum gathers soon after
        query(db_url, 'ANALYZE "user"')
    result = invoke("db", "explain", "--month", "2025-06", env=env)
    assert result.exit_code == 0, text(result)
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith(f"ok: the page query uses {INDEX} ("), line
    assert "at most " in line and " rows examined per page of 500" in line
    plan = invoke("db", "explain", "--month", "2025-06", "--plan", env=env)
    labels = ("detail",) if db_url.startswith("sqlite") else ("key", "rows", "Extra")
    if db_url.startswith("postgres"):
        labels = ("QUERY PLAN",)
    # Piped: plain "label  value" lines under a "plan row N (dialect)" title, no box.
    assert "plan row 1 (" in plan.stdout and "│" not in plan.stdout, plan.stdout
    assert all(re.search(rf"^{label}  ", plan.stdout, re.M) for label in labels), plan.stdout


def test_explain_without_the_index_says_slow(db_url: str) -> None:
    env = {"BATCHRUN_DB": db_url}
    migrate_and_seed(env, users=300)
    drop = f"DROP INDEX {INDEX}" + ("" if db_url.startswith(("sqlite", "postgres")) else " ON user")
    query(db_url, drop)
    result = invoke("db", "explain", "--month", "2025-06", env=env)
    assert result.exit_code == 0, text(result)
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith("slow: the page query uses "), line
    assert f"not {INDEX}" in line and "batchrun db migrate" in line


def test_verdict_on_plans_that_sort_or_scan() -> None:
    sorted_plan = [
        {"table": "user", "type": "ref", "key": INDEX, "rows": "1700", "Extra": "Using filesort"}
    ]
    assert verdict("mysql", sorted_plan).startswith("slow:")
    assert "then sorts them" in verdict("mysql", sorted_plan)
    scan = [{"table": "user", "type": "ALL", "key": None, "rows": "20000", "Extra": "Using where"}]
    assert "no index (ALL)" in verdict("mysql", scan) and "about 20000 rows" in verdict(
        "mysql", scan
    )
    small = [{"table": "user", "type": "range", "key": INDEX, "rows": "42", "Extra": ""}]
    assert "at most 42 rows examined per page" in verdict("mysql", small)
    sqlite_scan = [{"id": 2, "parent": 0, "notused": 0, "detail": "SCAN user"}]
    assert verdict("sqlite", sqlite_scan).startswith("slow: the page query uses no index")
    temp = [
        {"detail": f"SEARCH user USING INDEX {INDEX} (birth_month=?)"},
        {"detail": "USE TEMP B-TREE FOR ORDER BY"},
    ]
    assert verdict("sqlite", temp).startswith("slow:")

"""Bugs stop fast: a template that does not compile stops a run (and a dry
run) before anything is claimed; the same error for BATCHRUN_BUG_THRESHOLD entities in a
row stops it with those queued once and the rest left pending."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.birthday import seed_users
from support.cli import run_cli
from support.db import query

from batchrun.db import Store
from batchrun.job import Context, Job
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.policy.bugs import BugStreak, signature
from batchrun.queue.base import QueueMessage
from batchrun.queue.local import LocalQueue
from batchrun.runtime import Options, Runtime

JOB = """
import json

import batchrun

class Note(batchrun.Job):
    name = "note"
    period = "month"
    backends = {"crm": batchrun.Backend()}

    async def page(self, ctx, after, limit):
        table = '"user"' if ctx.db.dialect == "postgresql" else "user"
        return await ctx.db.fetch(
            f"SELECT id, email, first_name FROM {table} WHERE id > :after "
            "ORDER BY id LIMIT :limit", after=after, limit=limit)

    async def process(self, ctx, row):
        if ctx.env.get("NOTE_BUG") == "keyerror":
            row["no_such_column"]
        if ctx.env.get("NOTE_BUG") == "json":
            json.loads("not json")
        if ctx.env.get("NOTE_BUG") == "no-url":
            await ctx.http("crm").post("/notes", json={"id": row["id"]})
        if ctx.env.get("NOTE_BUG") == "typo-template":
            await ctx.send_email(to="someone@example.com", template="nte", name="x")
        if ctx.env.get("NOTE_BUG") == "no-await":
            ctx.send_email(to="someone@example.com", template="note", name=row["first_name"])
            return
        await ctx.send_email(to="someone@example.com", template="note",
                             name=row["first_name"])
"""


def setup(db_url: str, tmp_path: Path, body: str) -> dict[str, str]:
    (tmp_path / "note.py").write_text(JOB)
    folder = tmp_path / "templates" / "note"
    folder.mkdir(parents=True)
    (folder / "subject.txt").write_text("Hi")
    (folder / "body.txt").write_text(body)
    env = {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_JOBS": str(tmp_path / "note.py"),
    }
    assert run_cli("db", "migrate", env=env).returncode == 0
    seeded = run_cli("db", "seed", "--users", "400", env=env)
    assert seeded.returncode == 0, seeded.stderr
    return env


def touched(db_url: str) -> int:
    """Ledger rows of the job that are not pending (worked on), and queue messages."""
    rows = query(db_url, "SELECT COUNT(*) FROM batchrun_ledger WHERE job = 'note' AND state <> 0")
    return int(rows[0][0])


def queued(db_url: str) -> int:
    return int(query(db_url, "SELECT COUNT(*) FROM batchrun_queue")[0][0])


def sent(tmp_path: Path) -> int:
    outbox = tmp_path / "outbox"
    return len(list(outbox.glob("*.eml"))) if outbox.is_dir() else 0


def one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_a_keyerror_in_process_stops_after_ten(db_url: str, tmp_path: Path) -> None:
    env = setup(db_url, tmp_path, "Hello {{ name }}\n")
    env["NOTE_BUG"] = "keyerror"
    result = run_cli("run", "note", "--period", "2025-06", "--json", env=env)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert "KeyError" in data["error"]
    line = result.stderr.strip().splitlines()[-1]
    assert "KeyError" in line and "note.py" in line
    assert 10 <= touched(db_url) <= 10
    assert queued(db_url) == touched(db_url), "those entities queued once"
    assert data["left_pending"] > 0 and data["queued_for_retry"] == 10
    assert sent(tmp_path) == 0
    [run] = json.loads(run_cli("runs", "note", "--json", env=env).stdout)
    assert (run["outcome"], run["exit_code"]) == ("failed", 1)
    assert run["error"] == data["error"]  # the history row says why, as the summary does


def test_a_bug_raised_inside_a_library_names_the_job_s_line(db_url: str, tmp_path: Path) -> None:
    """The stop line named where the error was raised: decoder.py for a json.loads the
    job called, not the job's line that called it."""
    env = setup(db_url, tmp_path, "Hello {{ name }}\n")
    env["NOTE_BUG"] = "json"
    result = run_cli("run", "note", "--period", "2025-06", env=env)
    assert result.returncode == 1, result.stderr
    line = one_error(result.stderr)
    assert "JSONDecodeError" in line and "at note.py:" in line and "decoder" not in line, line


def test_a_backend_whose_url_is_not_set_stops_after_ten(db_url: str, tmp_path: Path) -> None:
    """It queued every entity of the period for a retry, which failed alike, exit 3, and
    said why only in ``status``: a setting never comes right by itself."""
    env = setup(db_url, tmp_path, "Hello {{ name }}\n")
    env["NOTE_BUG"] = "no-url"
    result = run_cli("run", "note", "--period", "2025-06", env=env)
    assert result.returncode == 1, result.stderr
    line = one_error(result.stderr)
    assert "cannot run as it is set up" in line and "set BATCHRUN_BACKEND_CRM_URL" in line
    assert touched(db_url) == 10 and queued(db_url) == 10


def test_a_template_name_no_folder_has_stops_at_its_first_use(db_url: str, tmp_path: Path) -> None:
    """A typo in ``template=`` is known only at the send, and was counted as any bug: ten
    entities failed (their effects before the send done) before the run stopped."""
    env = setup(db_url, tmp_path, "Hello {{ name }}\n")
    env["NOTE_BUG"] = "typo-template"
    result = run_cli("run", "note", "--period", "2025-06", "--concurrency", "1", env=env)
    assert result.returncode == 1, result.stderr
    line = one_error(result.stderr)
    assert "no email template nte/subject.txt" in line and "(1 entities in a row)" in line
    assert touched(db_url) == 1 and queued(db_url) == 1 and sent(tmp_path) == 0


def test_a_send_email_without_await_is_a_bug_not_a_success(db_url: str, tmp_path: Path) -> None:
    """The email never went out, Python only warned, and the ledger said sent: each entity
    done for good with nothing sent. Now a bug like any other: ten, then the run stops."""
    env = setup(db_url, tmp_path, "Hello {{ name }}\n")
    env["NOTE_BUG"] = "no-await"
    result = run_cli("run", "note", "--period", "2025-06", env=env)
    assert result.returncode == 1, result.stderr
    line = one_error(result.stderr)  # and no "never awaited" RuntimeWarning beside it
    assert "process() called ctx.send_email(...) without await: it never ran" in line
    assert touched(db_url) == 10 and queued(db_url) == 10 and sent(tmp_path) == 0
    done = query(db_url, "SELECT COUNT(*) FROM batchrun_ledger WHERE job = 'note' AND state = 1")
    assert done == [(0,)]


def test_failures_that_are_no_bug_are_said_under_the_table(db_url: str, tmp_path: Path) -> None:
    """A run that ends with entities failed says the commonest reasons (only ``status``
    did), and ``-v`` shows each bug's traceback, as its help says."""
    env = setup(db_url, tmp_path, "Hello {{ name }}\n")
    env["NOTE_BUG"] = "keyerror"
    env["BATCHRUN_BUG_THRESHOLD"] = "100000"  # not stopped: every entity fails alike
    result = run_cli("-v", "run", "note", "--period", "2025-06", env=env)
    assert result.returncode == 3, result.stderr
    failed = [line for line in result.stderr.splitlines() if " failed: KeyError" in line]
    assert len(failed) == 1 and failed[0].split()[0] == str(touched(db_url)), result.stderr
    assert "Traceback" in result.stderr and 'row["no_such_column"]' in result.stderr


def test_an_undefined_template_variable_stops_after_ten(db_url: str, tmp_path: Path) -> None:
    env = setup(db_url, tmp_path, "Hello {{ nmae }}\n")
    result = run_cli("run", "note", "--period", "2025-06", env=env)
    assert result.returncode == 1, result.stderr
    line = one_error(result.stderr)
    assert "'nmae' is undefined" in line and "note/body.txt" in line
    assert touched(db_url) <= 10 and queued(db_url) <= 10
    assert sent(tmp_path) == 0


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_template_syntax_error_stops_before_anything(
    db_url: str, tmp_path: Path, dry_run: bool
) -> None:
    env = setup(db_url, tmp_path, "Hello\n{% if %}\n")
    args = ["run", "note", "--period", "2025-06", *(["--dry-run"] if dry_run else [])]
    result = run_cli(*args, env=env)
    assert result.returncode == 1, result.stderr
    line = one_error(result.stderr)
    assert "note/body.txt:2" in line
    rows = query(db_url, "SELECT COUNT(*) FROM batchrun_ledger WHERE job = 'note'")
    assert rows[0][0] == 0 and queued(db_url) == 0 and sent(tmp_path) == 0


def test_the_streak_counts_one_signature_in_a_row() -> None:
    streak = BugStreak(3)

    def boom(key: str) -> KeyError:
        try:
            {}[key]
        except KeyError as exc:
            return exc
        raise AssertionError

    assert signature(boom("a")) == signature(boom("b"))  # the same line raised both
    assert signature(OSError("reset")) is None
    assert not streak.failure(boom("a"), job="j")
    assert not streak.failure(boom("a"), job="j")
    streak.success()
    assert not streak.failure(boom("a"), job="j")
    assert not streak.failure(ValueError("x"), job="j")
    assert not streak.failure(boom("a"), job="j")
    assert not streak.failure(boom("a"), job="j")
    assert streak.failure(boom("a"), job="j")
    assert streak.tripped is not None and "KeyError" in streak.tripped


class Broken(Job):
    """A job with a bug in ``process``, over the seed's users."""

    name = "broken"
    period = "month"

    async def page(self, ctx: Context, after: int, limit: int) -> list[dict[str, Any]]:
        table = '"user"' if ctx.db.dialect == "postgresql" else "user"
        return await ctx.db.fetch(
            f"SELECT id, email FROM {table} WHERE id > :after ORDER BY id LIMIT :limit",
            after=after,
            limit=limit,
        )

    async def process(self, ctx: Context, row: dict[str, Any]) -> None:
        row["no_such_column"]


async def test_a_bug_stops_a_retry_drain_after_ten(
    store: Store, db_url: str, make_settings: Callable[..., Any]
) -> None:
    await seed_users(store, 100, seed=5)
    settings = make_settings(db_url)
    queue = LocalQueue(store.db, max_receives=5)
    rt = Runtime([Birthday(), Broken()], store, mailer_from_url(settings.mail_url), queue, settings)
    ids = [int(r[0]) for r in query(db_url, "SELECT id FROM user ORDER BY id LIMIT 30")]
    await queue.send(
        [QueueMessage("task", "broken", "2025-06", entity_id=i).to_json() for i in ids]
    )
    result = await rt.retry(Options(concurrency=20))
    assert result.exit_code == 1
    assert result.error is not None and "KeyError" in result.error
    assert "error" in result.to_json()
    worked = query(
        db_url, "SELECT COUNT(*) FROM batchrun_ledger WHERE job = 'broken' AND state <> 0"
    )
    assert worked[0][0] == 10
    assert await queue.depths() == (30, 0), "every message stays for the fixed job"


def test_a_run_that_ends_on_an_error_lets_go_of_what_it_never_started(tmp_path: Path) -> None:
    """A prepare that met a database error ended the run with every entity of the page
    still claimed, for a lease, and ``left_pending`` 0: a rerun at once found them held."""
    flag = tmp_path / "down"
    flag.write_text("down")
    jobs = tmp_path / "flaky.py"
    jobs.write_text(
        "from pathlib import Path\n"
        "import batchrun\n"
        "from batchrun.errors import DatabaseError\n\n"
        "class Flaky(batchrun.Job):\n"
        "    name = 'flaky'\n"
        "    address = None\n\n"
        "    async def page(self, ctx, after, limit):\n"
        "        return [{'id': i} for i in range(after + 1, min(after + limit, 20) + 1)]\n\n"
        "    async def prepare(self, ctx, rows):\n"
        f"        if Path({str(flag)!r}).exists():\n"
        "            raise DatabaseError('database app: (2013) Lost connection')\n\n"
        "    async def process(self, ctx, row):\n"
        "        pass\n"
    )
    env = {
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'app.db'}",
        "BATCHRUN_JOBS": str(jobs),
        "BATCHRUN_LEASE_S": "60",
    }
    assert run_cli("db", "migrate", env=env).returncode == 0
    failed = run_cli("run", "flaky", "--period", "2025-06", "--json", env=env)
    assert failed.returncode == 1, failed.stderr
    assert json.loads(failed.stdout)["left_pending"] == 20, failed.stdout
    flag.unlink()
    rerun = run_cli("run", "flaky", "--period", "2025-06", "--json", env=env, timeout=30)
    done = json.loads(rerun.stdout)
    assert rerun.returncode == 0 and done["succeeded"] == 20, rerun.stdout + rerun.stderr

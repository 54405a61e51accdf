"""`batchrun why`: one entity's story for a sent, a skipped (invalid address), a suppressed,
a bounced and a dead entity, on SQLite, MariaDB and PostgreSQL; the CLI's JSON and lines;
and, for a job that sends no email, no Message-ID, its period's queue messages alone, and
a message's reason told as that of the attempt that queued it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import Result
from support.birthday import seed_users
from support.db import query
from support.smtp_server import SmtpTestServer, fail_recipients
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.control import story
from batchrun.control.history import History, outcome_of
from batchrun.db import Store
from batchrun.period import parse

JUNE = parse("month", "2025-06")


def june_users(db_url: str) -> list[tuple[int, str]]:
    rows = query(
        db_url,
        "SELECT id, email FROM user WHERE birth_month = 6 AND status = 10 "
        "AND email IS NOT NULL ORDER BY id",
    )
    return [(int(r[0]), str(r[1])) for r in rows]


def whats(told: story.Story) -> list[str]:
    return [e.what for e in told.events]


async def test_the_five_stories(
    db_url: str, store: Store, make_job: Callable[..., Any], smtp_server: SmtpTestServer
) -> None:
    rt = await make_job(db_url, mail_url=smtp_server.url)
    await seed_users(rt.store, 300, seed=3)
    users = june_users(db_url)
    assert len(users) >= 5, users
    (sent, _), (invalid, _), (suppressed, s_addr), (bounced, b_addr), (dead, d_addr) = users[:5]
    query(db_url, "UPDATE user SET email = %s WHERE id = %s", "bob@", invalid)
    await rt.store.suppress(s_addr, reason="unsubscribe", source="birthday")
    smtp_server.set_policy(fail_recipients({d_addr: "550 5.1.1 No such user"}))

    # The run recorded as the CLI records it: its counts say its successes sent email.
    history = History(rt.store.db, lease_s=rt.settings.lease_s)
    run_id = await history.start(kind="run", job="birthday", period="2025-06")
    summary = await rt.run(JUNE)
    code = summary.exit_code
    await history.end(run_id, exit_code=code, outcome=outcome_of(code), counts=summary.to_json())
    assert summary.dead_lettered == 1 and summary.skipped == 2, summary
    # After the run, SES reports a permanent bounce for one email that was accepted.
    await rt.store.record_mail_event(job="birthday", once="2025", entity_id=bounced, event="bounce")
    await rt.store.suppress(b_addr, reason="bounce", source="ses-0001")

    told = await story.tell(rt.wiring, rt.job, JUNE, sent)
    assert (told.state, told.eligible) == ("sent", False)
    send = next(e for e in told.events if e.what == "sent")
    assert "<birthday.2025." + str(sent) + "@example.com>" in send.detail
    assert smtp_server.message_ids().count(f"<birthday.2025.{sent}@example.com>") == 1
    assert [e.at for e in told.events] == sorted(e.at for e in told.events)

    told = await story.tell(rt.wiring, rt.job, JUNE, invalid)
    assert (told.state, told.eligible) == ("skipped", False)
    now = next(e for e in told.events if e.what == "not eligible now")
    assert "invalid address" in now.detail
    assert next(e for e in told.events if e.what == "skipped").detail == "invalid email address"

    told = await story.tell(rt.wiring, rt.job, JUNE, suppressed)
    assert (told.state, told.eligible) == ("skipped", False)
    assert "suppressed: unsubscribe" in next(e for e in told.events if e.what == "skipped").detail
    assert "unsubscribed" in whats(told)

    told = await story.tell(rt.wiring, rt.job, JUNE, bounced)
    assert told.state == "sent" and "bounce" in whats(told) and "suppressed (bounce)" in whats(told)
    assert (
        "suppressed: bounce" in next(e for e in told.events if e.what == "not eligible now").detail
    )
    assert "ses-0001" in next(e for e in told.events if e.what == "suppressed (bounce)").detail
    sent_at = next(e.at for e in told.events if e.what == "sent")
    suppressed_at = next(e.at for e in told.events if e.what == "suppressed (bounce)")
    assert whats(told).index("sent") < whats(told).index("suppressed (bounce)")
    assert sent_at <= suppressed_at

    told = await story.tell(rt.wiring, rt.job, JUNE, dead)
    assert told.state == "failed"
    failed = next(e for e in told.events if e.what == "failed")
    assert "550" in failed.detail and "1 attempt" in failed.detail
    letter = next(e for e in told.events if e.what == "dead-lettered")
    assert "550" in letter.detail

    # An entity not in the page at all (a July birthday) has no row and is not eligible.
    july = query(db_url, "SELECT id FROM user WHERE birth_month = 7 ORDER BY id LIMIT 1")
    told = await story.tell(rt.wiring, rt.job, JUNE, int(july[0][0]))
    assert told.state is None and not told.eligible
    assert "does not return it" in told.events[-1].detail or "no ledger row" in whats(told)


async def test_a_retrying_entity_shows_its_waiting_message(
    db_url: str, store: Store, make_job: Callable[..., Any], smtp_server: SmtpTestServer
) -> None:
    rt = await make_job(db_url, mail_url=smtp_server.url)
    await seed_users(rt.store, 120, seed=5)
    (first, address), *_ = june_users(db_url)
    smtp_server.set_policy(fail_recipients({address: "451 4.3.0 Try again later"}))
    summary = await rt.run(JUNE)
    assert summary.queued_for_retry == 1, summary
    told = await story.tell(rt.wiring, rt.job, JUNE, first)
    assert told.state == "retrying" and told.eligible
    retrying = next(e for e in told.events if e.what == "retrying")
    assert "451" in retrying.detail and "a retry message is queued" in retrying.detail
    waiting = next(e for e in told.events if e.what == "retry message waiting")
    assert "period 2025-06" in waiting.detail and "451" in waiting.detail


def invoke(*args: str, env: dict[str, str]) -> Result:
    """The CLI in-process, with ``env`` over the environment minus BATCHRUN_*."""
    full: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    full.update({"COLUMNS": "200", "NO_COLOR": "1", **env})
    return CliRunner().invoke(app, list(args), env=full)


def test_why_cli_json_and_lines(sqlite_url: str, tmp_path: Path) -> None:
    env = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
    }
    for args in (["db", "migrate"], ["db", "seed", "--users", "150"], ["birthday", "--json"]):
        done = invoke(*args, *(["--month", "2025-06"] if args[0] == "birthday" else []), env=env)
        assert done.exit_code == 0, done.output
    sent = june_users(sqlite_url)[0][0]
    done = invoke("why", "birthday", str(sent), "--period", "2025-06", "--json", env=env)
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert set(data) == {"job", "entity_id", "period", "eligible", "state", "events"}
    assert (data["job"], data["entity_id"], data["period"], data["state"]) == (
        "birthday",
        sent,
        "2025-06",
        "sent",
    )
    assert all(set(e) == {"at", "what", "detail", "run_id"} for e in data["events"])
    send = next(e for e in data["events"] if e["what"] == "sent")
    assert f"<birthday.2025.{sent}@example.com>" in send["detail"]
    ((run_id,),) = query(sqlite_url, "SELECT id FROM batchrun_run WHERE kind = 'run'")
    assert send["run_id"] == run_id  # the run `birthday` recorded
    done = invoke("why", "birthday", str(sent), "--period", "2025-06", env=env)
    assert done.exit_code == 0 and "ledger state sent" in done.stdout, done.output
    done = invoke("why", "nosuchjob", "1", env=env)
    assert done.exit_code == 2 and "unknown job 'nosuchjob'" in done.output, done.output
    done = invoke("why", "birthday", "1", "--period", "2025-13", env=env)
    assert done.exit_code == 2 and "2025-13" in done.output, done.output


async def test_each_step_names_its_run(
    db_url: str, store: Store, make_job: Callable[..., Any], smtp_server: SmtpTestServer
) -> None:
    rt = await make_job(db_url, mail_url=smtp_server.url)
    await seed_users(rt.store, 150, seed=6)
    (first, _), (second, address), *_ = june_users(db_url)
    smtp_server.set_policy(fail_recipients({address: "451 4.3.0 Try again later"}))
    history = History(rt.store.db, lease_s=rt.settings.lease_s)
    run_id = await history.start(kind="run", job="birthday", period="2025-06")
    summary = await rt.run(JUNE)
    await history.end(run_id, exit_code=3, outcome="retrying", counts=summary.to_json())
    later = await history.start(kind="retry", job=None, period=None)  # a drain, not the run

    told = await story.tell(rt.wiring, rt.job, JUNE, first)
    assert next(e for e in told.events if e.what == "sent").run_id == run_id
    told = await story.tell(rt.wiring, rt.job, JUNE, second)
    assert next(e for e in told.events if e.what == "retrying").run_id == run_id
    assert next(e for e in told.events if e.what == "retry message waiting").run_id == run_id
    assert next(e for e in told.events if e.what == "eligible now").run_id is None
    # The ledger's own run_id (the run that claimed the entity) wins over the times.
    query(db_url, "UPDATE batchrun_ledger SET run_id = %s WHERE entity_id = %s", later, first)
    told = await story.tell(rt.wiring, rt.job, JUNE, first)
    assert next(e for e in told.events if e.what == "sent").run_id == later


# A job that sends no email (an HTTP push, say), over the seeded users 1 to 3; entity 2
# fails each time, with the reason and retry delay its environment gives.
NO_MAIL_JOB = """
import batchrun


class Touch(batchrun.Job):
    name = "touch"
    period = "day"

    async def page(self, ctx, after, limit):
        return await ctx.db.fetch(
            "SELECT id, email FROM user WHERE id > :after AND id <= 3 ORDER BY id LIMIT :limit",
            after=after,
            limit=limit,
        )

    async def process(self, ctx, row):
        if row["id"] == 2:
            raise batchrun.Retry(ctx.env["WHY_REASON"], float(ctx.env["WHY_DELAY_S"]))
"""


def no_mail_job(sqlite_url: str, tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A migrated, seeded database and the ``touch`` job: returns ``cli(*args, reason=,
    delay_s=)``, which runs a command (exit 0 or 3) and gives its ``--json`` output."""
    spec = tmp_path / "touch.py"
    spec.write_text(NO_MAIL_JOB)
    env = {"BATCHRUN_DB": sqlite_url, "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}"}
    for args in (["db", "migrate"], ["db", "seed", "--users", "20"]):
        done = invoke(*args, env=env)
        assert done.exit_code == 0, done.output

    def cli(*args: str, reason: str = "HTTP 500", delay_s: float = 600) -> dict[str, Any]:
        own = {**env, "WHY_REASON": reason, "WHY_DELAY_S": str(delay_s)}
        done = invoke("--jobs", str(spec), *args, "--json", env=own)
        assert done.exit_code in (0, 3), done.output
        data: dict[str, Any] = json.loads(done.stdout)
        return data

    return cli


def test_a_job_that_sends_no_email_names_no_message_id(sqlite_url: str, tmp_path: Path) -> None:
    cli = no_mail_job(sqlite_url, tmp_path)
    assert cli("run", "touch", "--period", "2025-07-01")["emails_sent"] == 0
    told = cli("why", "touch", "1", "--period", "2025-07-01")
    whats = [e["what"] for e in told["events"]]
    assert "sent" not in whats and "succeeded" in whats, told
    assert not any("Message-ID" in e["detail"] for e in told["events"]), told
    done = next(e for e in told["events"] if e["what"] == "succeeded")
    assert "no email sent" in done["detail"] and done["run_id"] is not None, done
    assert (
        "(succeeded)"
        in next(e for e in told["events"] if e["what"] == "not eligible now")["detail"]
    )


def test_only_the_period_asked_for_has_its_messages_told(sqlite_url: str, tmp_path: Path) -> None:
    cli = no_mail_job(sqlite_url, tmp_path)
    for day in ("2025-07-01", "2025-07-02", "2025-07-03"):
        assert (
            cli("run", "touch", "--period", day, reason=f"down on {day}")["queued_for_retry"] == 1
        )
    told = cli("why", "touch", "2", "--period", "2025-07-02")
    waiting = [e["detail"] for e in told["events"] if e["what"] == "retry message waiting"]
    assert len(waiting) == 1 and "period 2025-07-02" in waiting[0], waiting
    assert not any("2025-07-01" in e["detail"] or "07-03" in e["detail"] for e in told["events"])
    # A period with none tells none.
    assert not [
        e
        for e in cli("why", "touch", "2", "--period", "2025-07-04")["events"]
        if "message" in e["what"]
    ]


def test_a_message_tried_again_tells_its_first_reason_as_earlier(
    sqlite_url: str, tmp_path: Path
) -> None:
    cli = no_mail_job(sqlite_url, tmp_path)
    # Attempt 1 fails and queues a retry at once; the drain's attempt 2 fails otherwise and
    # hides the same message again (its body keeps attempt 1's reason).
    cli("run", "touch", "--period", "2025-07-01", reason="no backend URL", delay_s=0)
    assert cli("retry", reason="HTTP 500 from the CRM")["failed"] == 1
    ((message_id, receives),) = query(sqlite_url, "SELECT id, receive_count FROM batchrun_queue")
    assert receives == 1
    run_id = query(sqlite_url, "SELECT id FROM batchrun_run WHERE kind = 'run'")[0][0]

    events = cli("why", "touch", "2", "--period", "2025-07-01")["events"]
    whats = [e["what"] for e in events]
    queued = events[whats.index("retry message queued")]
    assert queued["detail"] == (
        f"message {message_id} (retry, period 2025-07-01) queued after attempt 1: no backend URL"
    )
    assert queued["run_id"] == run_id  # the run whose attempt queued it
    retrying = events[whats.index("retrying")]
    assert "2 attempts" in retrying["detail"] and "HTTP 500 from the CRM" in retrying["detail"]
    assert whats.index("retry message queued") < whats.index("retrying")
    assert queued["at"] <= retrying["at"]
    (waiting,) = [e for e in events if e["what"] == "retry message waiting"]
    assert "received 1 times" in waiting["detail"] and "no backend URL" not in waiting["detail"]
    assert waiting["run_id"] is None and whats[-1] == "retry message waiting", whats


def test_a_dead_letter_is_told_when_the_drain_that_gave_up_made_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    """It was told at the time the message was first queued, credited to the run that
    queued it, before the drain's attempts it came after."""
    cli = no_mail_job(sqlite_url, tmp_path)
    cli("run", "touch", "--period", "2025-07-01", reason="HTTP 500", delay_s=0)
    spec = str(tmp_path / "touch.py")
    env = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}",
        "BATCHRUN_MAX_RECEIVES": "1",  # the drain's attempt is the last
        "WHY_REASON": "HTTP 500",
        "WHY_DELAY_S": "0",
    }
    drained = invoke("--jobs", spec, "retry", "--json", env=env)
    assert json.loads(drained.stdout)["dead_lettered"] == 1, drained.output
    runs = dict(query(sqlite_url, "SELECT kind, id FROM batchrun_run"))
    events = cli("why", "touch", "2", "--period", "2025-07-01")["events"]
    whats = [e["what"] for e in events]
    letter = events[whats.index("dead-lettered")]
    assert letter["run_id"] == runs["retry"], events
    assert letter["at"] >= events[whats.index("failed")]["at"], events  # after the last try
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)

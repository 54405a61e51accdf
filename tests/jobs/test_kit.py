"""batchrun.testing: the harness runs a job as batchrun does, on SQLite, MariaDB and
PostgreSQL; the mailbox shows what a recipient reads and fails on request; the HTTP double
answers what it is told. Every assertion here is one a job author's test would make."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from support.db import mysql_connect, pg_connect

import batchrun
from batchrun.awaited import NotAwaitedError
from batchrun.errors import NotMigratedError, PermanentMailError, UsageError
from batchrun.testing import AsyncHarness, Harness, HttpDouble, LedgerEntry
from batchrun.testing.database import split_statements

SCHEMA = {
    "sqlite": """
        CREATE TABLE member (id INTEGER PRIMARY KEY, contact_email TEXT, name TEXT NOT NULL,
                             active INTEGER NOT NULL);
    """,
    "mysql": """
        CREATE TABLE member (id BIGINT PRIMARY KEY, contact_email VARCHAR(254) NULL,
                             name VARCHAR(100) NOT NULL, active TINYINT NOT NULL);
    """,
    "postgresql": """
        CREATE TABLE member (id BIGINT PRIMARY KEY, contact_email TEXT NULL,
                             name TEXT NOT NULL, active SMALLINT NOT NULL);
    """,
}
MEMBERS = [  # (id, contact_email, name, active)
    (1, "ann@example.com", "Ann", 1),
    (2, "bob@example.com", "Bob", 1),
    (3, "cy@example.com", "Cy", 0),  # inactive: not in the page
    (4, "no-at-sign", "Dee", 1),  # invalid: skipped
    (5, "eve@example.com", "Eve", 1),
    (6, None, "Fay", 1),  # no address: process skips it
]


class Newsletter(batchrun.Job):
    """A monthly note to every active member, by its contact_email column."""

    name = "newsletter"
    period = "month"
    address = "contact_email"
    sender = "News <news@example.com>"
    counters = ("notes",)

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        return await ctx.db.fetch(
            "SELECT id, contact_email, name FROM member WHERE active = 1 AND id > :after "
            "ORDER BY id LIMIT :limit",
            after=after,
            limit=limit,
        )

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        if not row["contact_email"]:
            raise batchrun.Skip("no address")
        await ctx.send_email(
            to=row["contact_email"],
            to_name=row["name"],
            subject=f"News for {ctx.period}",
            text=f"Hello {row['name']},\n\nthe news of {ctx.period}.\n",
            html=f"<p>Hello {row['name']},</p>",
        )
        ctx.count("notes")


def members(h: Harness) -> None:
    h.execute("INSERT INTO member (id, contact_email, name, active) VALUES :rows", rows=MEMBERS)


@pytest.fixture
def harness() -> Iterator[Harness]:
    with Harness(Newsletter, schema=SCHEMA) as h:
        members(h)
        yield h


def test_a_run_sends_once_and_the_ledger_says_so(harness: Harness) -> None:
    summary = harness.run("2025-06")
    assert (summary.eligible, summary.succeeded, summary.skipped) == (5, 3, 2)
    assert summary.emails_sent == 3 and summary.notes == 3
    assert summary.exit_code == 0
    assert [e.to for e in harness.emails] == [
        "ann@example.com",
        "bob@example.com",
        "eve@example.com",
    ]
    ann = harness.emails[0]
    assert (ann.to_name, ann.subject) == ("Ann", "News for 2025-06")
    assert ann.text == "Hello Ann,\n\nthe news of 2025-06.\n"
    assert ann.html == "<p>Hello Ann,</p>"
    assert ann.sender == "News <news@example.com>"
    assert ann.message_id == "<newsletter.2025-06.1@example.com>"
    assert ann.headers["x-batchrun-id"] == ann.message_id
    assert ann.headers["To"] == "Ann <ann@example.com>"
    assert b"Subject: News for 2025-06" in ann.raw

    entry = harness.ledger(1, "2025-06")
    assert entry is not None and (entry.state, entry.attempts, entry.done) == ("succeeded", 1, True)
    invalid = harness.ledger(4, "2025-06")
    assert invalid is not None and invalid.state == "skipped"
    assert invalid.reason == "invalid email address"
    no_address = harness.ledger(6, "2025-06")
    assert no_address is not None and no_address.reason == "no address"
    assert harness.ledger(3, "2025-06") is None  # never in the page

    again = harness.run("2025-06")
    assert (again.eligible, again.emails_sent) == (0, 0)
    assert len(harness.emails) == 3
    assert harness.run("2025-07").emails_sent == 3  # once per month


def test_the_dry_run_counts_what_the_run_then_does(harness: Harness) -> None:
    harness.suppress("bob@example.com", "unsubscribe")
    dry = harness.dry_run("2025-06")
    assert dry.dry_run and (dry.eligible, dry.skipped, dry.emails_sent) == (5, 3, 0)
    assert harness.emails == [] and harness.ledger(1, "2025-06") is None
    # The skips come from Job.address ("contact_email"): the invalid, the suppressed and
    # the missing one; the real run agrees.
    real = harness.run("2025-06")
    assert (real.eligible, real.skipped) == (dry.eligible, dry.skipped)
    bob = harness.ledger(2, "2025-06")
    assert bob is not None and bob.reason == "suppressed: unsubscribe"
    assert harness.mailbox.to("bob@example.com") == []


def test_a_job_that_sends_no_email_says_so_and_its_dry_run_agrees() -> None:
    """With the default address column, a job that only counts (an HTTP push, say) had
    its dry run skip the invalid and missing addresses its runs never look at."""

    class Tally(Newsletter):
        address = "contact_email"

        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            ctx.count("notes")

    class Silent(Tally):
        address = None

    for job, skipped in ((Tally, 2), (Silent, 0)):
        with Harness(job, schema=SCHEMA) as h:
            members(h)
            dry, real = h.dry_run("2025-06"), h.run("2025-06")
            assert (dry.skipped, real.skipped) == (skipped, 0), job.__name__
            assert real.counters == {"notes": 5}


def test_a_misspelled_setting_is_a_warning_a_test_shows() -> None:
    """The CLI logs ``peroid = "day"`` with a hint; the kit only logged it, which pytest
    hides, and the test then failed on the period it got instead."""

    class Typo(Newsletter):
        peroid = "day"

    with pytest.warns(
        UserWarning, match="Typo.peroid is nothing batchrun reads: did you mean 'period'"
    ):
        Harness(Typo, schema=SCHEMA)


def test_a_temporary_failure_is_retried_and_then_succeeds(harness: Harness) -> None:
    harness.mailbox.fail("temporary", to="bob@example.com", times=1)
    summary = harness.run("2025-06")
    assert (summary.failed, summary.queued_for_retry, summary.exit_code) == (1, 1, 3)
    bob = harness.ledger(2, "2025-06")
    assert bob is not None and bob.state == "retrying" and "451" in (bob.reason or "")
    assert harness.status("2025-06")["retrying"] == 1

    result = harness.retry()
    assert (result.processed, result.succeeded, result.failed, result.remaining) == (1, 1, 0, 0)
    assert harness.ledger(2, "2025-06") == LedgerEntry("succeeded", 2, None)
    assert [e.to for e in harness.mailbox.to("bob@example.com")] == ["bob@example.com"]
    assert harness.mailbox.attempts.count("bob@example.com") == 2


def test_a_permanent_failure_is_dead_lettered_and_never_retried(harness: Harness) -> None:
    harness.mailbox.fail("permanent", to=["eve@example.com"], reason="550 5.1.1 gone")
    summary = harness.run("2025-06")
    assert (summary.failed, summary.dead_lettered, summary.queued_for_retry) == (1, 1, 0)
    eve = harness.ledger(5, "2025-06")
    assert eve is not None and eve.state == "failed" and "550 5.1.1 gone" in (eve.reason or "")
    problems = harness.status("2025-06")["problems"]
    assert problems[5].state == "failed" and problems[4].state == "skipped"
    assert harness.retry().processed == 0
    assert harness.mailbox.attempts.count("eve@example.com") == 1


def test_an_outage_opens_the_breaker_and_retry_completes_the_month() -> None:
    rows = [(i, f"m{i}@example.com", f"M{i}", 1) for i in range(1, 31)]
    with Harness(Newsletter, schema=SCHEMA, env={"BATCHRUN_BREAKER_THRESHOLD": "3"}) as h:
        h.execute("INSERT INTO member (id, contact_email, name, active) VALUES :rows", rows=rows)
        h.mailbox.fail("outage")
        down = h.run("2025-06", concurrency=1, page_size=5)
        assert down.exit_code == 3 and down.emails_sent == 0
        assert down.stopped is not None and "unreachable" in down.stopped
        assert down.queued_for_retry == down.failed == down.eligible > 0
        h.mailbox.recover()
        h.retry()
        h.run("2025-06")  # what the breaker left unread
        assert sorted(e.to for e in h.emails) == sorted(r[1] for r in rows)
        assert all(h.ledger(i, "2025-06").state == "succeeded" for i in range(1, 31))  # type: ignore[union-attr]


def test_preview_and_direct_calls(harness: Harness) -> None:
    email = harness.preview(2, "2025-06")
    assert (email.to, email.subject) == ("bob@example.com", "News for 2025-06")
    assert harness.emails == [] and harness.ledger(2, "2025-06") is None
    with pytest.raises(UsageError, match="entity 3 is not in the job's page"):
        harness.preview(3, "2025-06")

    rows = harness.page("2025-06", after=1, limit=2)
    assert [r["id"] for r in rows] == [2, 4]
    harness.process(rows[0], "2025-06")
    assert [e.to for e in harness.emails] == ["bob@example.com"]
    assert harness.counters == {"notes": 1}
    with pytest.raises(batchrun.Skip, match="no address"):
        harness.process({"id": 6, "contact_email": None, "name": "Fay"}, "2025-06")
    harness.mailbox.fail("permanent", times=1)
    with pytest.raises(PermanentMailError, match="injected"):
        harness.process(rows[0], "2025-06")


def test_a_send_email_without_await_fails_the_authors_test() -> None:
    """The kit runs ``process`` as a run does: an email never sent is an error, not a
    RuntimeWarning beside a passing test."""

    class Forgetful(Newsletter):
        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            ctx.send_email(to=row["contact_email"], subject="Hi", text="Hello\n")

    with Harness(Forgetful, schema=SCHEMA) as h:
        members(h)
        with pytest.raises(NotAwaitedError, match="without await: it never ran"):
            h.process({"id": 1, "contact_email": "ann@example.com", "name": "Ann"}, "2025-06")
        assert h.emails == []


def test_a_process_that_returns_false_is_told_it_succeeded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``return False`` reads as a failure to its author; batchrun reads no return value,
    so it is a success: the kit warns, a run says so once."""

    class Returning(Newsletter):
        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> Any:
            await super().process(ctx, row)
            return False

    with Harness(Returning, schema=SCHEMA) as h:
        members(h)
        with pytest.warns(UserWarning, match=r"process\(\) returned False, which batchrun"):
            h.process({"id": 1, "contact_email": "ann@example.com", "name": "Ann"}, "2025-06")
        with caplog.at_level(logging.WARNING, logger="batchrun"):
            summary = h.run("2025-06")
        told = [r for r in caplog.records if "returned False" in r.getMessage()]
        assert summary.succeeded >= 2 and len(told) == 1, (summary, told)


def test_sends_run_as_tasks_and_in_a_task_group_as_they_ran_as_coroutines() -> None:
    """send_email hands out something that knows whether it was run: still a coroutine to
    asyncio.create_task and TaskGroup, as it was when send_email was an async def."""

    class Together(Newsletter):
        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            first = asyncio.create_task(
                ctx.send_email(to=row["contact_email"], subject="1", text="1\n")
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(ctx.send_email(to=row["contact_email"], subject="2", text="2\n"))
            await first
            await asyncio.gather(ctx.send_email(to=row["contact_email"], subject="3", text="3\n"))

    with Harness(Together, schema=SCHEMA) as h:
        members(h)
        h.process({"id": 1, "contact_email": "ann@example.com", "name": "Ann"}, "2025-06")
        assert sorted(e.subject for e in h.emails) == ["1", "2", "3"]


def test_a_typo_in_send_email_and_a_preview_of_a_backend_call_say_what_is_wrong() -> None:
    """``subjetc=`` said "needs subject and text, or a template"; a preview of a job that
    calls its backend first was "RuntimeError: backend ... is not called", exit 1."""

    class Typo(Newsletter):
        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            await ctx.send_email(to=row["contact_email"], subjetc="Hi", text="Hello\n")

    class Pushing(Newsletter):
        backends = {"crm": batchrun.Backend()}

        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            async with ctx.backend("crm"):
                pass
            await super().process(ctx, row)

    with Harness(Typo, schema=SCHEMA) as h:
        members(h)
        with pytest.raises(
            TypeError, match="needs subject and text, or a template; it got 'subjetc'"
        ):
            h.process({"id": 1, "contact_email": "ann@example.com", "name": "Ann"}, "2025-06")

    class Stray(Newsletter):  # a variable beside subject and text: ignored, as it was
        async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
            await ctx.send_email(to=row["contact_email"], subject="Hi", text="Hi\n", name="Ann")

    with Harness(Stray, schema=SCHEMA) as h:
        members(h)
        h.process({"id": 1, "contact_email": "ann@example.com", "name": "Ann"}, "2025-06")
        assert [e.subject for e in h.emails] == ["Hi"]
    with Harness(Pushing, schema=SCHEMA) as h:
        members(h)
        with pytest.raises(UsageError, match="newsletter calls backend 'crm', which a dry run or"):
            h.preview(1, "2025-06")


def test_from_defaults_to_the_job_name_and_batchrun_from_wins() -> None:
    class Plain(Newsletter):
        name = "plain"
        sender = None

    with Harness(Plain, schema=SCHEMA) as h:
        members(h)
        h.run("2025-06", limit=1)
        assert h.emails[0].sender == "plain@localhost"
        assert h.emails[0].message_id == "<plain.2025-06.1@localhost>"
    with Harness(Newsletter, schema=SCHEMA, env={"BATCHRUN_FROM": "Ops <ops@corp.example>"}) as h:
        members(h)
        h.run("2025-06", limit=1)
        assert h.emails[0].sender == "Ops <ops@corp.example>"


def test_a_job_that_breaks_the_contract_is_one_line() -> None:
    class Broken(Newsletter):
        name = "Broken Name"

    with pytest.raises(UsageError, match="does not match"):
        Harness(Broken)

    class BadSender(Newsletter):
        name = "badsender"
        sender = "not an address"

    with pytest.raises(UsageError, match="sender 'not an address' is not a usable"):
        Harness(BadSender)


def test_a_missing_table_stops_the_run_before_anything() -> None:
    class NeedsMember(Newsletter):
        name = "needs"
        requires = {"member": ("id", "contact_email")}

    # No schema: the table is not there.
    with Harness(NeedsMember) as h, pytest.raises(NotMigratedError, match="needs member"):
        h.run("2025-06")


async def test_the_async_harness_on_every_database(db_url: str) -> None:
    async with AsyncHarness(Newsletter, db=db_url, schema=SCHEMA) as h:
        await h.execute(
            "INSERT INTO member (id, contact_email, name, active) VALUES :rows", rows=MEMBERS
        )
        assert h.url == db_url
        summary = await h.run("2025-06")
        assert (summary.succeeded, summary.skipped) == (3, 2)
        entry = await h.ledger(5, "2025-06")
        assert entry is not None and entry.state == "succeeded"
        assert [
            r["name"] for r in await h.fetch("SELECT name FROM member WHERE id = :id", id=5)
        ] == ["Eve"]


def _databases(server: str) -> set[str]:
    if server.startswith("postgres"):
        with pg_connect(server) as conn:
            return {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
    conn = mysql_connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES")
            return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()


@pytest.mark.parametrize("server", ["mysql_server", "postgres_server"])
async def test_a_server_url_without_a_database_gets_one_of_its_own(
    server: str, request: pytest.FixtureRequest
) -> None:
    base = str(request.getfixturevalue(server))
    async with AsyncHarness(Newsletter, db=base, schema=SCHEMA) as h:
        name = urlsplit(h.url).path.strip("/")
        assert name.startswith("batchrun_test_") and name in _databases(base)
        await h.execute(
            "INSERT INTO member (id, contact_email, name, active) VALUES :rows", rows=MEMBERS
        )
        assert (await h.run("2025-06")).succeeded == 3
    assert name not in _databases(base)


def test_the_sqlite_default_is_removed_at_close() -> None:
    h = Harness(Newsletter, schema=SCHEMA)
    path = h.url.removeprefix("sqlite:///")
    members(h)
    assert h.run("2025-06").succeeded == 3
    h.close()
    import os

    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_schema_scripts_split_at_statement_ends_only() -> None:
    script = """
        -- a comment; not the end
        CREATE TABLE t (a TEXT DEFAULT 'x;y', "b;c" INTEGER);  /* also ; not */
        INSERT INTO t VALUES ('it''s; fine', 1);
        -- trailing comment only
    """
    assert split_statements(script) == [
        "-- a comment; not the end\n        CREATE TABLE t (a TEXT DEFAULT 'x;y', \"b;c\" INTEGER)",
        "/* also ; not */\n        INSERT INTO t VALUES ('it''s; fine', 1)",
    ]
    with Harness(Newsletter, schema=script, migrate=False) as h:
        assert h.fetch('SELECT a, "b;c" AS b FROM t') == [{"a": "it's; fine", "b": 1}]


def test_the_http_double_answers_what_it_is_told() -> None:
    with HttpDouble() as api:
        api.respond(
            201, json=lambda r: {"id": f"g{len(api.requests)}", "echo": r.json if r.body else None}
        )
        api.respond(429, headers={"Retry-After": "7"}, times=1, path="/grants")
        api.respond(503, times=1, method="GET")
        with httpx.Client(base_url=api.url) as client:
            first = client.post("/grants", json={"n": 1}, headers={"Idempotency-Key": "k1"})
            assert (first.status_code, first.headers["Retry-After"]) == (429, "7")
            second = client.post("/grants?x=1", json={"n": 2})
            assert second.status_code == 201
            assert second.json() == {"id": "g2", "echo": {"n": 2}}
            assert client.get("/grants").status_code == 503
            assert client.get("/grants").status_code == 201
        assert [r.method for r in api.requests] == ["POST", "POST", "GET", "GET"]
        assert api.requests[0].headers["idempotency-key"] == "k1"
        assert api.requests[1].query == {"x": "1"} and api.requests[1].json == {"n": 2}
        assert len(api.requests_to("/grants", "post")) == 2
        api.reset()
        with httpx.Client(base_url=api.url) as client:
            missing = client.get("/nothing")
        assert missing.status_code == 404 and len(api.requests) == 1
        assert api.env("encoder") == {"BATCHRUN_BACKEND_ENCODER_URL": api.url}


def test_the_http_double_delays_until_a_client_times_out() -> None:
    with HttpDouble() as api:
        api.respond(200, json={}, delay_s=5.0, times=1)
        with httpx.Client(base_url=api.url, timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                client.get("/slow")
            assert client.get("/slow").status_code == 404  # the delayed answer was used up


def test_the_birthday_job_on_the_kit() -> None:
    from batchrun.jobs.birthday import Birthday

    with Harness(Birthday) as h:  # an empty database: the job's own steps make its tables
        h.execute(
            "INSERT INTO user (id, first_name, last_name, email, date_of_birth, status) "
            "VALUES :rows",
            rows=[
                (1, "Ada", "Lovelace", "ada@example.com", "1990-06-15", 10),
                (2, "Bob", "Ray", "bob@example.com", "1985-07-04", 10),  # July
                (3, "Cy", "Dunn", "cy@example.com", "1980-06-01", 0),  # inactive
            ],
        )
        summary = h.run("2025-06")
        assert (summary.succeeded, summary.cards_created, summary.emails_sent) == (1, 1, 1)
        (email,) = h.emails
        assert email.sender == "birthday@localhost"  # the birthday job's own From
        assert email.message_id == "<birthday.2025.1@localhost>"
        (card,) = h.fetch(
            "SELECT gift_code FROM gift_card WHERE idempotency_key = 'birthday:2025:1'"
        )
        code = card["gift_code"]
        assert "-".join(code[i : i + 4] for i in range(0, 16, 4)) in email.text
        assert b"base64" not in email.raw and b"Content-Transfer-Encoding: 7bit" in email.raw
        assert h.ledger(1, "2025-06") == LedgerEntry("succeeded", 1, None)
        assert h.run("2025-06").eligible == 0
        assert h.run("2026-06").cards_created == 1  # a card a year


# -- a task job: submit, then retry works the tasks ---------------------------------------


class _Steps(batchrun.Task):
    """Records each task it works, in the order worked; a task for entity 9 fails."""

    name = "steps"

    async def process(self, ctx: batchrun.Context, task: Any) -> None:
        if task.entity_id == 9:
            raise batchrun.Fail("entity 9 is refused")
        await ctx.db.execute(
            "INSERT INTO step (task_key, entity_id, kind) VALUES (:key, :entity, :kind)",
            key=task.key,
            entity=task.entity_id,
            kind=task.data["kind"],
        )


_STEPS = "CREATE TABLE step (task_key TEXT PRIMARY KEY, entity_id INTEGER, kind TEXT)"


def test_the_kit_submits_a_task_jobs_tasks_and_retry_works_them_in_order() -> None:
    with Harness(_Steps, schema=_STEPS) as h:
        for kind in ("scan", "thumbnail", "publish"):
            assert h.submit(7, {"kind": kind}, key=f"u1-{kind}").queued
        assert not h.submit(7, {"kind": "scan"}, key="u1-scan").queued  # submitted before
        refused = h.submit(9, {"kind": "scan"})
        assert refused.queued and refused.key  # a key of its own when none is given

        worked = h.retry()
        assert (worked.succeeded, worked.failed, worked.dead_lettered) == (3, 1, 1)
        rows = h.fetch("SELECT task_key, kind FROM step WHERE entity_id = 7 ORDER BY rowid")
        assert [row["kind"] for row in rows] == ["scan", "thumbnail", "publish"]
        assert h.retry().processed == 0  # each task once


def test_the_kit_refuses_to_submit_to_a_job_of_periods() -> None:
    class Periodic(batchrun.Job):
        name = "periodic"

        async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[Any]:
            return []

        async def process(self, ctx: batchrun.Context, row: Any) -> None:
            return None

    with Harness(Periodic) as h, pytest.raises(UsageError, match="not a task job"):
        h.submit(1)

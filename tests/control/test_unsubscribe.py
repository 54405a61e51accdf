"""One-click unsubscribe and the suppression list: tokens, headers, the Lambda's HTTP answer,
the CLI, and suppressed addresses in birthday runs (SQLite file and MariaDB, real SMTP)."""

from __future__ import annotations

import asyncio
import base64
import email
import email.policy
import json
import logging
import math
import os
import time
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from support import EVENTS
from support.birthday import card_counts, eligible_ids, seed_users, status_of
from support.db import query, table_digest
from support.lambda_context import FakeContext
from support.periods import month
from support.smtp_server import SmtpTestServer, fail_recipients
from typer.testing import CliRunner

from batchrun import aws_lambda
from batchrun.cli import app
from batchrun.db import Store, connect
from batchrun.db.store import State, address_key
from batchrun.effects.sending import Sender
from batchrun.errors import ConfigError, InvalidTokenError, UsageError
from batchrun.job import Context, Skip
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import Message, valid_address
from batchrun.runtime import Options, Runtime
from batchrun.settings import Settings
from batchrun.unsubscribe import Signer, apply, token_of

JUNE = month(2025, 6)
SECRET = "test-secret-0123456789abcdefghij"
BASE = "https://abcdefghij1234567890abcdefghij12.lambda-url.us-east-1.on.aws/unsubscribe"
UNSUBSCRIBE = {"unsubscribe_url": BASE, "unsubscribe_secret": SECRET}
ENV = {"BATCHRUN_UNSUBSCRIBE_URL": BASE, "BATCHRUN_UNSUBSCRIBE_SECRET": SECRET}


def parsed(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def body_texts(message: EmailMessage) -> tuple[str, str]:
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    return str(text.get_content()), str(html.get_content())


def valid_eligible(db_url: str, month: int = 6) -> dict[int, str]:
    """id -> address of the users a month's run mails."""
    rows = dict(query(db_url, "SELECT id, email FROM user WHERE birth_month = %s", month))
    return {
        uid: rows[uid]
        for uid in eligible_ids(db_url, month)
        if rows[uid] is not None and valid_address(rows[uid])
    }


# -- tokens --------------------------------------------------------------------------------


def test_a_token_round_trips_and_is_url_safe() -> None:
    signer = Signer(SECRET, BASE + "/")
    for job, address in [("birthday", "ada@example.com"), ("renewal", "zoë+tag@exämple.org")]:
        token = signer.token(job, address)
        assert token.replace("-", "").replace("_", "").replace(".", "").isalnum(), token
        assert token.isascii() and "=" not in token
        request = signer.verify(token)
        assert (request.job, request.address) == (job, address)
        assert signer.url(job, address) == f"{BASE}/{token}"  # one slash, whatever the base
        assert token_of(signer.url(job, address)) == token
        assert token_of(f" {signer.url(job, address)}/?utm=x ") == token
    # Deterministic: the same (job, address) always gets the same token.
    assert signer.token("birthday", "a@example.com") == Signer(SECRET).token(
        "birthday", "a@example.com"
    )


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def test_a_forged_truncated_altered_or_foreign_token_is_refused() -> None:
    signer = Signer(SECRET)
    token = signer.token("birthday", "ada@example.com")
    payload, mac = token.split(".")
    other = Signer("another-secret-0123456789abcdef")
    flipped = "A" if mac[5] != "A" else "B"
    refused = {
        "signed with another secret": other.token("birthday", "ada@example.com"),
        "another address, same MAC": f"{_b64('birthday:eve@example.com')}.{mac}",
        "another job, same MAC": f"{_b64('renewal:ada@example.com')}.{mac}",
        "forged from nothing": f"{_b64('birthday:ada@example.com')}.{'A' * 43}",
        "one MAC character changed": f"{payload}.{mac[:5]}{flipped}{mac[6:]}",
        "truncated": token[:-1],
        "truncated MAC": f"{payload}.{mac[:22]}",
        "MAC only": mac,
        "no MAC": payload,
        "payload extended": f"{payload}A.{mac}",
        "payload padded": f"{payload}==.{mac}",
        "empty": "",
        "non-ASCII": token[:-1] + "é",
        "whitespace inside": f"{payload} .{mac}",
        "huge": "A" * 5000 + "." + mac,
        "signed without a job": f"{_b64('ada@example.com')}.{other_mac(signer, 'ada@example.com')}",
    }
    for what, bad in refused.items():
        with pytest.raises(InvalidTokenError) as caught:
            signer.verify(bad)
        assert "ada" not in str(caught.value) and "eve" not in str(caught.value), what
    assert signer.verify(token).address == "ada@example.com"


def other_mac(signer: Signer, payload_text: str) -> str:
    """A genuine MAC over a payload batchrun would never make (no ``job:`` part)."""
    return signer.mac(_b64(payload_text).encode()).decode()


def test_settings_need_both_variables_a_long_secret_and_an_https_base() -> None:
    settings = Settings.from_env(ENV)
    assert (settings.unsubscribe_url, settings.unsubscribe_secret) == (BASE, SECRET)
    assert SECRET not in repr(settings)
    assert Settings.from_env({}).unsubscribe_secret is None
    bad = [
        {"BATCHRUN_UNSUBSCRIBE_URL": BASE},
        {"BATCHRUN_UNSUBSCRIBE_SECRET": SECRET},
        {**ENV, "BATCHRUN_UNSUBSCRIBE_SECRET": "short"},
        {**ENV, "BATCHRUN_UNSUBSCRIBE_URL": "ftp://example.com/u"},
        {**ENV, "BATCHRUN_UNSUBSCRIBE_URL": "https://example.com/u?list=1"},
        {**ENV, "BATCHRUN_UNSUBSCRIBE_URL": "https://example.com/u\r\nBcc: x@evil"},
        {**ENV, "BATCHRUN_UNSUBSCRIBE_URL": "https://example.com/" + "u" * 400},
    ]
    for env in bad:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env(env)
        assert SECRET not in str(caught.value)


# -- the headers ---------------------------------------------------------------------------


def test_extra_header_values_are_checked_like_the_others() -> None:
    base = {
        "sender": "birthday@example.com",
        "to_addr": "ada@example.com",
        "to_name": "Ada",
        "subject": "Hi",
        "text": "Hello",
        "html": "",
        "message_id": "<birthday.2025.1@example.com>",
    }
    for name, value in [
        ("List-Unsubscribe", "<https://x.example/t>\r\nBcc: evil@attacker.example"),
        ("List-Unsubscribe", "<https://x.example/t>\nBcc: evil@attacker.example"),
        ("List-Unsubscribe", "<https://x.example/t>\u2028"),
        ("List-Unsubscribe", "<https://x.example/é>"),
        ("List-Unsubscribe", "<https://x.example/" + "t" * 1000 + ">"),
        ("Bad Name", "x"),
        ("Bad:Name", "x"),
        ("Bcc", "evil@attacker.example"),
        ("From", "evil@attacker.example"),
    ]:
        with pytest.raises(ValueError):
            Message(**base, headers=((name, value),)).to_bytes()
    message = parsed(Message(**base, headers=(("X-Campaign", "june"),)).to_bytes())
    assert message["X-Campaign"] == "june" and message["Auto-Submitted"] == "auto-generated"


async def test_headers_and_unsubscribe_url_present_exactly_when_configured(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await seed_users(store, 600, seed=21)
    want = valid_eligible(db_url)
    with caplog.at_level(logging.WARNING, logger="batchrun"):
        plain: Runtime = await make_job(db_url, mail_url=smtp_server.url)
        await plain.run(JUNE, Options(concurrency=8, page_size=5, limit=12))
    assert 5 < len(smtp_server.messages) <= 12
    for received in smtp_server.messages:
        message = parsed(received.raw)
        assert "List-Unsubscribe" not in message and "List-Unsubscribe-Post" not in message
        assert message["Auto-Submitted"] == "auto-generated"
        text, html = body_texts(message)
        assert "Unsubscribe" not in text and "Unsubscribe" not in html
    warnings = [r for r in caplog.records if "one-click unsubscribe" in r.getMessage()]
    assert len(warnings) == 1, "one warning for the run, not one per message"

    smtp_server.reset()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchrun"):
        signed: Runtime = await make_job(db_url, mail_url=smtp_server.url, **UNSUBSCRIBE)
        await signed.run(JUNE, Options(concurrency=8, page_size=20))
    assert not [r for r in caplog.records if "one-click unsubscribe" in r.getMessage()]
    signer = Signer(SECRET)
    by_address = {m.recipients[0]: m for m in smtp_server.messages}
    assert len(by_address) == len(smtp_server.messages) > 0
    for address, received in by_address.items():
        message = parsed(received.raw)
        value = str(message["List-Unsubscribe"])
        assert value.startswith(f"<{BASE}/") and value.endswith(">"), value
        request = signer.verify(value[len(BASE) + 2 : -1])
        assert (request.job, request.address) == ("birthday", address)
        assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert message["Auto-Submitted"] == "auto-generated"
        assert len(message.get_all("List-Unsubscribe") or []) == 1
        text, html = body_texts(message)
        url = value[1:-1]
        assert f"Unsubscribe: {url}" in text
        assert f'href="{url}"' in html
    assert set(by_address) <= set(want.values())
    assert len(by_address) > 10


async def test_file_mail_logs_no_warning(
    store: Store,
    db_url: str,
    make_job: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await seed_users(store, 100, seed=22)
    with caplog.at_level(logging.WARNING, logger="batchrun"):
        job: Runtime = await make_job(db_url)  # file://outbox: nobody's mailbox
        summary = await job.run(JUNE, Options(concurrency=4))
    assert summary.emails_sent > 0
    assert not [r for r in caplog.records if "one-click unsubscribe" in r.getMessage()]


# -- the suppression list ------------------------------------------------------------------


async def test_addresses_compare_in_one_key_case_folded_and_in_idna(store: Store) -> None:
    assert address_key("Bob.Smith@Example.COM") == "bob.smith@example.com"
    assert address_key("Jo@Bücher.Example") == "jo@xn--bcher-kva.example"
    assert address_key("ZOË@X.org") == address_key("zoe\u0308@x.org") == "zoë@x.org"  # NFC
    assert await store.suppress("Bob@Example.COM", reason="manual", source="test")
    assert not await store.suppress("bob@example.com", reason="bounce")  # the same address
    found = await store.suppressed(
        ["Bob@example.com", "BOB@EXAMPLE.com", "bob@example.com", "Böb@example.com", "x"]
    )
    assert found == dict.fromkeys(
        ["Bob@example.com", "BOB@EXAMPLE.com", "bob@example.com"], "manual"
    )
    entry = await store.suppression("Bob@EXAMPLE.COM")
    assert entry is not None
    assert (entry.address, entry.reason, entry.source) == ("bob@example.com", "manual", "test")
    assert abs(entry.created_at - time.time() * 1000) < 60_000
    assert await store.suppress("jo@xn--bcher-kva.example", reason="bounce")  # as SES says it
    assert await store.suppressed(["Jo@bücher.example"]) == {"Jo@bücher.example": "bounce"}
    assert [s.address for s in await store.suppressions()] == [
        "bob@example.com",
        "jo@xn--bcher-kva.example",
    ]
    assert [s.address for s in await store.suppressions(after="bob@example.com")] == [
        "jo@xn--bcher-kva.example"
    ]
    assert await store.unsuppress("ann@example.com") is False
    assert await store.unsuppress("BOB@eXample.com") is True
    assert await store.suppressed(["Bob@example.com"]) == {}
    # Nothing a database cannot hold goes near it: a lookup finds nothing, a write refuses.
    assert await store.suppressed(["a\x00@example.com", "b\ud800@example.com"]) == {}
    for bad in ("a\x00@example.com", "b\ud800@example.com", "c@" + "x" * 260 + ".com"):
        with pytest.raises(ValueError):
            await store.suppress(bad, reason="manual")
    with pytest.raises(ValueError):
        await store.suppress("ada@example.com", reason="because")  # type: ignore[arg-type]


async def test_a_suppressed_address_gets_no_card_and_no_mail_and_status_says_why(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await seed_users(store, 1200, seed=23)
    want = valid_eligible(db_url)
    unsubscribed, bounced, manual, decoy = sorted(want)[:4]

    def domain_upper(address: str) -> str:
        local, _, domain = address.partition("@")
        return f"{local}@{domain.upper()}"

    # The one-click path, with the domain's case changed: still the same address.
    signer = Signer(SECRET, BASE)
    assert await apply(
        store, signer.verify(signer.token("birthday", domain_upper(want[unsubscribed])))
    )
    assert await store.suppress(want[bounced], reason="bounce", source="ses")
    assert await store.suppress(domain_upper(want[manual]), reason="manual")
    # The whole address in capitals is the same address too (one key, case-folded).
    assert want[decoy].upper() != want[decoy]
    assert await store.suppress(want[decoy].upper(), reason="complaint")
    suppressed = {
        unsubscribed: "unsubscribe",
        bounced: "bounce",
        manual: "manual",
        decoy: "complaint",
    }

    job: Runtime = await make_job(db_url, mail_url=smtp_server.url, **UNSUBSCRIBE)
    dry = await Runtime(Birthday(), job.store, None, None, job.settings).run(
        JUNE, Options(), dry_run=True
    )
    eligible = len(eligible_ids(db_url, 6))
    assert dry.skipped == eligible - len(want) + len(suppressed)

    lookups: list[int] = []
    real = job.store.suppressed

    async def counted(addresses: Any) -> dict[str, str]:
        addresses = list(addresses)
        lookups.append(len(addresses))
        return await real(addresses)

    monkeypatch.setattr(job.store, "suppressed", counted)
    page_size = 40
    summary = await job.run(JUNE, Options(concurrency=10, page_size=page_size))
    assert summary.exit_code == 0
    assert summary.emails_sent == summary.cards_created == len(want) - len(suppressed)
    assert summary.skipped == eligible - len(want) + len(suppressed)
    # One look-up a page (before prepare), none per message.
    assert len(lookups) <= math.ceil(eligible / page_size), lookups
    assert sum(lookups) <= eligible

    cards = card_counts(db_url, 2025)
    assert not set(suppressed) & set(cards), "no card for a suppressed user"
    assert cards == dict.fromkeys(set(want) - set(suppressed), 1)
    mailed = {m.recipients[0] for m in smtp_server.messages}
    assert not mailed & {want[uid] for uid in suppressed}
    assert len(smtp_server.messages) == len(want) - len(suppressed)

    status = await status_of(job, JUNE)
    reasons = {uid: reason for uid, state, _, reason in status.problems if state == State.SKIPPED}
    for uid, why in suppressed.items():
        assert reasons[uid] == f"suppressed: {why}"
    assert status.pending == 0
    again = await job.run(JUNE, Options(concurrency=10, page_size=page_size))
    assert (again.eligible, again.emails_sent) == (0, 0), "skipped for good, not retried"


async def test_suppressed_between_a_failure_and_its_retry_is_skipped_by_the_retry(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 400, seed=24)
    want = valid_eligible(db_url)
    uid = min(want)
    smtp_server.set_policy(fail_recipients({want[uid]: "451 4.3.0 Try again later"}))
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    first = await job.run(JUNE, Options(concurrency=8))
    assert first.queued_for_retry == 1
    smtp_server.set_policy(None)
    sent_before = len(smtp_server.messages)
    assert await store.suppress(want[uid], reason="complaint", source="ses")
    result = await job.retry(Options(concurrency=4))
    assert result.processed == 1 and result.failed == 0 and result.remaining == 0
    assert len(smtp_server.messages) == sent_before, "no mail after the suppression"
    status = await status_of(job, JUNE)
    assert (uid, State.SKIPPED, 2, "suppressed: complaint") in status.problems


async def test_send_email_to_a_suppressed_address_raises_skip_itself(
    store: Store, db_url: str, make_job: Callable[..., Any]
) -> None:
    await seed_users(store, 200, seed=25)
    job: Runtime = await make_job(db_url)
    want = valid_eligible(db_url)
    uid = min(want)
    assert await store.suppress(want[uid], reason="manual")
    with pytest.raises(UsageError, match="suppressed: manual"):
        await job.preview("birthday", JUNE, uid)  # process raises Skip: nothing to show
    sender = Sender(
        None,
        job.settings,
        summary=None,
        lease=None,
        stop=job.stop,
        limiter=None,
        templates=None,
        store=job.store,
    )
    ctx = Context(job.job, JUNE, job.store.jobdb, sender).entity(uid)
    assert await ctx.suppressed([want[uid], "nobody@example.com"]) == {want[uid]: "manual"}
    assert sender.suppressions.queries == 1
    with pytest.raises(Skip, match="suppressed: manual"):
        await ctx.send_email(to=want[uid], subject="s", text="t")
    assert sender.suppressions.queries == 1, "answered from the run's look-ups"


# -- the CLI -------------------------------------------------------------------------------


def invoke(*args: str, env: dict[str, str]) -> Result:
    full: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    full.update({"COLUMNS": "200", "NO_COLOR": "1"})
    full.update(env)
    return CliRunner().invoke(app, list(args), env=full)


def test_suppress_add_remove_list_and_unsubscribe_through_the_cli(sqlite_url: str) -> None:
    env = {"BATCHRUN_DB": sqlite_url}
    assert invoke("db", "migrate", env=env).exit_code == 0
    added = invoke("suppress", "add", "Ann@Example.COM", env=env)
    assert added.exit_code == 0, added.output
    assert "suppressed ann@example.com (manual)" in added.output
    again = invoke("suppress", "add", "Ann@example.com", "--reason", "bounce", env=env)
    assert again.exit_code == 0 and "already suppressed (manual" in again.output
    bounce = invoke("suppress", "add", "zed@example.org", "--reason", "bounce", env=env)
    assert bounce.exit_code == 0, bounce.output
    for bad in (["not-an-address"], ["ann@example.com", "--reason", "spite"]):
        result = invoke("suppress", "add", *bad, env=env)
        assert result.exit_code == 2, result.output

    listed = invoke("suppress", "list", "--json", env=env)
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.stdout)
    assert data["count"] == 2
    assert [(s["address"], s["reason"], s["source"]) for s in data["suppressions"]] == [
        ("ann@example.com", "manual", "cli"),
        ("zed@example.org", "bounce", "cli"),
    ]
    table = invoke("suppress", "list", env=env)
    assert table.exit_code == 0 and "ann@example.com" in table.stdout and "bounce" in table.stdout

    removed = invoke("suppress", "remove", "Ann@EXAMPLE.com", env=env)
    assert removed.exit_code == 0 and "removed" in removed.output
    missing = invoke("suppress", "remove", "Ann@example.com", env=env)
    assert missing.exit_code == 0 and "not on the suppression list" in missing.output

    token = Signer(SECRET).token("birthday", "Cleo@Example.net")
    no_secret = invoke("unsubscribe", token, env=env)
    assert no_secret.exit_code == 2 and "BATCHRUN_UNSUBSCRIBE_SECRET" in no_secret.output
    env = {**env, **ENV}
    forged = invoke("unsubscribe", token[:-2] + "AA", env=env)
    assert forged.exit_code == 2 and "Cleo" not in forged.output
    applied = invoke("unsubscribe", f"{BASE}/{token}", env=env)  # the whole URL works too
    assert applied.exit_code == 0, applied.output
    assert "unsubscribed Cleo@Example.net" in applied.output
    twice = invoke("unsubscribe", token, env=env)
    assert twice.exit_code == 0 and "already suppressed" in twice.output
    data = json.loads(invoke("suppress", "list", "--json", env=env).stdout)
    assert {(s["address"], s["reason"], s["source"]) for s in data["suppressions"]} == {
        ("cleo@example.net", "unsubscribe", "birthday"),
        ("zed@example.org", "bounce", "cli"),
    }
    for command in (["suppress"], ["suppress", "add"], ["unsubscribe"]):
        assert "Usage" in invoke(*command, "--help", env=env).output


# -- the Lambda's HTTP answer --------------------------------------------------------------


def load_event(name: str, **replace: str) -> dict[str, Any]:
    text = (EVENTS / name).read_text()
    for key, value in replace.items():
        text = text.replace(key, value)
    return dict(json.loads(text))


@pytest.fixture
def migrated(sqlite_url: str) -> str:
    async def go() -> None:
        database = await connect(sqlite_url, create=True)
        try:
            await Store(database).migrate()
        finally:
            await database.close()

    asyncio.run(go())
    return sqlite_url


def suppression_rows(db_url: str) -> list[tuple[Any, ...]]:
    return query(db_url, "SELECT address, reason, source FROM batchrun_suppression")


@pytest.mark.parametrize(
    "event", ["unsubscribe_one_click_post.json", "unsubscribe_apigw_post.json"]
)
def test_a_one_click_post_suppresses_the_address_and_answers_200(
    migrated: str, event: str, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = {"BATCHRUN_DB": migrated, **ENV}
    token = Signer(SECRET).token("birthday", "dana@Example.com")
    response = aws_lambda.handle(
        load_event(event, TOKEN=token), FakeContext(30, "req-http"), environ=environ
    )
    assert response["statusCode"] == 200, response
    assert response["headers"]["Content-Type"] == "text/html; charset=utf-8"
    assert response["headers"]["Cache-Control"] == "no-store"
    assert response["isBase64Encoded"] is False
    assert suppression_rows(migrated) == [("dana@example.com", "unsubscribe", "birthday")]
    again = aws_lambda.handle(
        load_event(event, TOKEN=token), FakeContext(30, "req-http"), environ=environ
    )
    assert again["statusCode"] == 200, "a second click is fine"
    assert len(suppression_rows(migrated)) == 1
    logged = capsys.readouterr().out
    assert token not in logged and "dana" not in logged


def test_a_get_shows_a_confirm_button_and_touches_nothing(migrated: str, tmp_path: Path) -> None:
    token = Signer(SECRET).token("birthday", "eve@example.com")
    before = table_digest(migrated)
    # Not even the database's file is needed: a GET only checks the token.
    environ = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'nowhere' / 'none.db'}", **ENV}
    event = load_event("unsubscribe_browser_get.json", TOKEN=token)
    response = aws_lambda.handle(event, FakeContext(30, "req-http"), environ=environ)
    assert response["statusCode"] == 200, response
    body = response["body"]
    assert '<form method="post">' in body and "<button" in body
    assert 'name="List-Unsubscribe" value="One-Click"' in body
    assert "eve@example.com" in body
    assert "form-action 'self'" in response["headers"]["Content-Security-Policy"]
    assert response["headers"]["Referrer-Policy"] == "no-referrer"
    assert table_digest(migrated) == before


@pytest.mark.parametrize(
    "event", ["unsubscribe_one_click_post.json", "unsubscribe_browser_get.json"]
)
def test_a_bad_token_gets_400_and_says_nothing_about_the_address(
    migrated: str, event: str, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = {"BATCHRUN_DB": migrated, **ENV}
    genuine = Signer(SECRET).token("birthday", "frank@example.com")
    payload, mac = genuine.split(".")
    foreign = Signer("another-secret-0123456789abcdef").token("birthday", "frank@example.com")
    for token in (f"{payload}.{mac[:-1]}", foreign, payload, f"{payload}.{'A' * 43}", ""):
        path_token = token or "x"
        response = aws_lambda.handle(
            load_event(event, TOKEN=path_token), FakeContext(30, "req-http"), environ=environ
        )
        assert response["statusCode"] == 400, (token, response)
        assert "frank" not in response["body"] and "example.com" not in response["body"]
        assert "<form" not in response["body"]
    assert suppression_rows(migrated) == []
    assert "frank" not in capsys.readouterr().out


def test_other_methods_and_an_unreachable_database(migrated: str, tmp_path: Path) -> None:
    token = Signer(SECRET).token("birthday", "gil@example.com")
    event = load_event("unsubscribe_one_click_post.json", TOKEN=token)
    event["requestContext"]["http"]["method"] = "DELETE"
    response = aws_lambda.handle(
        event, FakeContext(30, "req-http"), environ={"BATCHRUN_DB": migrated, **ENV}
    )
    assert response["statusCode"] == 405 and response["headers"]["Allow"] == "GET, POST"

    unmigrated = f"sqlite:///{tmp_path / 'empty.db'}"
    query(unmigrated, "CREATE TABLE t (x INTEGER)")
    post = load_event("unsubscribe_one_click_post.json", TOKEN=token)
    response = aws_lambda.handle(
        post, FakeContext(30, "req-http"), environ={"BATCHRUN_DB": unmigrated, **ENV}
    )
    assert response["statusCode"] == 503, "the sender may try again; never a false 200"
    assert "gil" not in response["body"]

    response = aws_lambda.handle(
        post, FakeContext(30, "req-http"), environ={"BATCHRUN_DB": migrated}
    )
    assert response["statusCode"] == 503, "unsubscribe is not configured"

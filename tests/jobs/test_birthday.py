"""The birthday job end to end: real database (SQLite file and MariaDB), real SMTP server."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.birthday import birthday_scope, card_counts, eligible_ids, seed_users, status_of
from support.checks import assert_one_card_and_one_email_each
from support.db import query, table_digest
from support.periods import month
from support.smtp_server import SmtpTestServer

from batchrun.db import Store
from batchrun.db.store import State, now_ms
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import valid_address
from batchrun.runtime import Options, Runtime

JUNE = month(2025, 6)


def valid_eligible(db_url: str, month: int = 6) -> set[int]:
    ids = eligible_ids(db_url, month)
    rows = query(db_url, "SELECT id, email FROM user WHERE birth_month = %s", month)
    good = {int(r[0]) for r in rows if r[1] is not None and valid_address(r[1])}
    return ids & good


async def test_month_completes_once_and_a_rerun_does_nothing(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 1500, seed=3)
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    summary = await job.run(JUNE, Options(concurrency=20, page_size=100))
    want = valid_eligible(db_url)
    assert len(want) > 50
    assert summary.exit_code == 0
    assert summary.cards_created == summary.emails_sent == len(want)
    assert summary.eligible == len(eligible_ids(db_url, 6))
    assert summary.skipped == summary.eligible - len(want)
    assert_one_card_and_one_email_each(db_url, smtp_server, want)

    again = await job.run(JUNE, Options(concurrency=20, page_size=100))
    assert (again.eligible, again.cards_created, again.emails_sent) == (0, 0, 0)
    assert len(smtp_server.messages) == len(want)


async def test_the_email_carries_the_card_and_a_stable_message_id(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 300, seed=4)
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    await job.run(JUNE, Options(concurrency=4))
    message = smtp_server.messages[0]
    uid = int(str(message.message_id).strip("<>").split(".")[2].split("@")[0])
    assert message.message_id == f"<birthday.2025.{uid}@example.com>"
    (code,) = query(
        db_url, "SELECT gift_code FROM gift_card WHERE idempotency_key = %s", f"birthday:2025:{uid}"
    )[0]
    grouped = "-".join(code[i : i + 4] for i in range(0, 16, 4))
    body = message.email.get_body(("plain",))
    assert body is not None and grouped in body.get_content()


async def test_two_runs_at_once_partition_the_month(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 2000, seed=5)
    smtp_server.set_latency(0.002)
    first: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    second: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    a, b = await asyncio.gather(
        first.run(JUNE, Options(concurrency=10, page_size=50)),
        second.run(JUNE, Options(concurrency=10, page_size=50)),
    )
    want = valid_eligible(db_url)
    assert a.cards_created + b.cards_created == len(want)
    assert a.emails_sent + b.emails_sent == len(want)
    assert a.emails_sent > 0 and b.emails_sent > 0, "both runs should have done some work"
    assert_one_card_and_one_email_each(db_url, smtp_server, want)


async def test_temporary_failures_exit_3_and_retry_completes_the_month(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 1500, seed=6)
    want = valid_eligible(db_url)
    emails = dict(query(db_url, "SELECT email, id FROM user WHERE birth_month = 6"))
    rng = random.Random(42)
    failing = {e for e, uid in emails.items() if uid in want and rng.random() < 0.10}
    assert failing
    smtp_server.set_policy(
        lambda rcpt, _n: "451 4.3.0 Try again later" if rcpt in failing else None
    )
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    summary = await job.run(JUNE, Options(concurrency=20))
    assert summary.exit_code == 3
    assert summary.queued_for_retry == summary.failed == len(failing)
    assert summary.emails_sent == len(want) - len(failing)
    status = await status_of(job, month(2025, 6))
    assert status.pending == len(failing)
    assert (await job.queue.depths())[0] == len(failing)  # type: ignore[union-attr]

    smtp_server.set_policy(None)  # the server recovers
    result = await job.retry(Options(concurrency=20))
    assert (result.processed, result.succeeded, result.failed) == (len(failing),) * 2 + (0,)
    assert result.remaining == 0 and result.exit_code == 0
    status = await status_of(job, month(2025, 6))
    assert (status.pending, status.emails_sent) == (0, len(want))
    assert_one_card_and_one_email_each(db_url, smtp_server, want)


async def test_permanent_failure_is_recorded_dead_lettered_and_never_retried(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 400, seed=8)
    uid, email = query(
        db_url,
        "SELECT id, email FROM user WHERE birth_month = 6 AND "
        "status = 10 AND email LIKE %s ORDER BY id LIMIT 1",
        "%@example.com",
    )[0]
    smtp_server.set_policy(lambda rcpt, _n: "550 5.1.1 No such user" if rcpt == email else None)
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    summary = await job.run(JUNE, Options(concurrency=5))
    assert (summary.failed, summary.dead_lettered, summary.queued_for_retry) == (1, 1, 0)
    assert summary.exit_code == 0
    status = await status_of(job, month(2025, 6))
    assert status.failed_permanent == 1 and status.pending == 0
    assert [(p[0], p[1]) for p in status.problems if p[1] == State.FAILED] == [(uid, 4)]
    assert "550" in str(status.problems[0][3]) or any("550" in str(p[3]) for p in status.problems)
    assert await job.queue.depths() == (0, 1)  # type: ignore[union-attr]
    result = await job.retry()
    assert result.processed == 0
    assert uid not in smtp_server.sends_per_user()


async def test_a_user_failing_every_time_is_dead_lettered_after_max_receives(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 300, seed=9)
    uid, email = query(
        db_url,
        "SELECT id, email FROM user WHERE birth_month = 6 AND "
        "status = 10 AND email LIKE %s ORDER BY id LIMIT 1",
        "%@example.com",
    )[0]
    smtp_server.set_policy(lambda rcpt, _n: "451 4.3.0 later" if rcpt == email else None)
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url, max_receives=3)
    summary = await job.run(JUNE, Options(concurrency=5))
    assert summary.queued_for_retry == 1
    result = await job.retry()  # backoff is 0 in tests: one drain sees every attempt
    assert result.processed == 3 and result.dead_lettered == 1 and result.succeeded == 0
    status = await status_of(job, month(2025, 6))
    assert status.failed_permanent == 1 and status.pending == 0
    reason = next(p[3] for p in status.problems if p[0] == uid)
    assert "gave up after 4 attempts" in reason and "451" in reason  # the run's, the drain's 3
    assert await job.queue.depths() == (0, 1)  # type: ignore[union-attr]


async def test_invalid_addresses_are_skipped_counted_and_not_retried(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 400, seed=10)
    ids = sorted(eligible_ids(db_url, 6))[:3]
    for uid, bad in zip(ids, ["bob@", "no-at-sign", "two@@at.com"], strict=True):
        query(db_url, "UPDATE user SET email = %s WHERE id = %s", bad, uid)
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    summary = await job.run(JUNE, Options(concurrency=5))
    assert summary.skipped >= 3 and summary.exit_code == 0
    counts = card_counts(db_url, 2025)
    assert all(uid not in counts for uid in ids)
    status = await status_of(job, month(2025, 6))
    assert {p[0] for p in status.problems if p[1] == State.SKIPPED} >= set(ids)
    assert status.pending == 0
    assert (await job.retry()).processed == 0


async def test_dry_run_touches_nothing(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
    tmp_path: Path,
) -> None:
    await seed_users(store, 800, seed=12)
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    await job.run(JUNE, Options(limit=20))  # some history, so the digest covers every table
    before = table_digest(db_url)
    sent_before = len(smtp_server.messages)
    dry = Runtime(Birthday(), job.store, None, None, job.settings)
    summary = await dry.run(JUNE, Options(), dry_run=True)
    assert summary.eligible == len(eligible_ids(db_url, 6)) - 20
    assert (summary.cards_created, summary.emails_sent) == (0, 0)
    assert table_digest(db_url) == before
    assert len(smtp_server.messages) == sent_before


async def test_mail_server_down_trips_the_breaker_and_loses_nothing(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 3000, seed=13)
    want = valid_eligible(db_url)
    # The server takes the run's preflight session, then closes the channel (421) on every
    # message: down after the run started (a server down before it is found by preflight).
    smtp_server.set_policy(lambda _rcpt, _n: "421 4.3.2 Service shutting down")
    down: Runtime = await make_job(db_url, mail_url=smtp_server.url, breaker_threshold=3)
    summary = await down.run(JUNE, Options(concurrency=8, page_size=50))
    smtp_server.set_policy(None)
    assert summary.exit_code == 3
    assert summary.emails_sent == 0
    assert summary.eligible < len(want), "the breaker should stop paging"
    assert summary.queued_for_retry == summary.failed == summary.eligible - summary.skipped
    assert summary.continuation and summary.stopped and "mail" in summary.stopped

    up: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    result = await up.retry(Options(concurrency=20))
    assert result.failed == 0 and result.remaining == 0
    status = await status_of(up, month(2025, 6))
    assert status.pending == 0
    assert_one_card_and_one_email_each(db_url, smtp_server, want)


async def test_a_dead_runs_claims_are_taken_over_when_they_expire(
    store: Store,
    db_url: str,
    smtp_server: SmtpTestServer,
    make_job: Callable[..., Any],
) -> None:
    await seed_users(store, 600, seed=14)
    want = valid_eligible(db_url)
    held = sorted(want)[:10]
    # A run that died holding ten users: its lease runs one more second.
    await store.claim(birthday_scope(2025, 6), ids=held, new_ids=held, me="f" * 32, lease_ms=1000)
    started = now_ms()
    job: Runtime = await make_job(db_url, mail_url=smtp_server.url)
    summary = await job.run(JUNE, Options(concurrency=10))
    assert now_ms() - started >= 900, "the run must wait for the foreign claims to expire"
    assert summary.emails_sent == len(want)
    assert smtp_server.sends_per_user() == Counter(dict.fromkeys(want, 1))

"""The birthday job's data in tests: demo users, what its month should reach, its cards
and its status."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from types import SimpleNamespace

from batchrun.db import Store, connect
from batchrun.db.store import Scope
from batchrun.jobs.birthday import Birthday, demo
from batchrun.mail.base import valid_address
from batchrun.period import Period
from batchrun.runtime import Runtime
from support.db import query
from support.smtp_server import SmtpTestServer

_CODE = re.compile(r"\b[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}\b")


async def seed_users(store: Store, count: int, *, seed: int = 1, force: bool = False) -> int:
    """The birthday job's demo users (``batchrun db seed``)."""
    return await demo.seed_users(store.jobdb, count, seed=seed, force=force)


async def seed(store: Store, count: int, *, seed: int = 7) -> None:
    await seed_users(store, count, seed=seed)


async def status_of(runtime: Runtime, period: Period, problems: int = 50) -> SimpleNamespace:
    """What `batchrun status` reports for the birthday job: cards, emails_sent, pending ..."""
    counts = await runtime.status("birthday", period, problems=problems)
    return SimpleNamespace(emails_sent=counts["succeeded"], **counts)


def birthday_scope(year: int = 2025, month: int = 6) -> Scope:
    """The ledger scope of the birthday job's month."""
    return Scope("birthday", f"{year:04d}", f"{year:04d}-{month:02d}")


def eligible_ids(db_url: str, month: int) -> set[int]:
    """Users the job must reach: active, born in the month, with an address."""
    rows = query(
        db_url,
        "SELECT id FROM user WHERE birth_month = %s AND status = 10 AND email IS NOT NULL",
        month,
    )
    return {int(r[0]) for r in rows}


def card_counts(db_url: str, year: int) -> dict[int, int]:
    """user id -> number of this job's cards for ``year``."""
    rows = query(
        db_url,
        "SELECT idempotency_key FROM gift_card WHERE idempotency_key LIKE %s",
        f"birthday:{year}:%",
    )
    counts: dict[int, int] = {}
    for (key,) in rows:
        uid = int(str(key).rsplit(":", 1)[1])
        counts[uid] = counts.get(uid, 0) + 1
    return counts


def want_ids(db_url: str, month: int = 6) -> set[int]:
    """Users who must end with a card and an email: eligible, with a valid address."""
    rows = query(db_url, "SELECT id, email FROM user WHERE birth_month = %s", month)
    good = {int(r[0]) for r in rows if r[1] is not None and valid_address(r[1])}
    return eligible_ids(db_url, month) & good


def user_of(message_id: str | None) -> tuple[int, int]:
    """(year, user id) of a stable Message-ID ``<birthday.YEAR.UID@domain>``."""
    assert message_id is not None
    _, year, uid = message_id.strip("<>").split("@")[0].split(".")
    return int(year), int(uid)


def codes_in_mail(server: SmtpTestServer, year: int) -> dict[int, set[str]]:
    """user id -> the gift codes their emails showed (decoded text part)."""
    shown: dict[int, set[str]] = {}
    for message in server.messages:
        message_year, uid = user_of(message.message_id)
        if message_year != year:
            continue
        body = message.email.get_body(("plain",))
        assert body is not None
        shown.setdefault(uid, set()).update(_CODE.findall(body.get_content()))
    return shown


def card_codes(db_url: str, year: int) -> dict[int, str]:
    rows = query(
        db_url,
        "SELECT idempotency_key, gift_code FROM gift_card WHERE idempotency_key LIKE %s",
        f"birthday:{year}:%",
    )
    return {int(str(key).rsplit(":", 1)[1]): str(code) for key, code in rows}


def ledger_states(db_url: str, year: int) -> Counter[int]:
    rows = query(
        db_url,
        "SELECT state, COUNT(*) FROM batchrun_ledger WHERE job = 'birthday' AND once_key = %s "
        "GROUP BY state",
        str(year),
    )
    return Counter({int(state): int(count) for state, count in rows})


def grouped_code(code: str) -> str:
    """A gift code as an email shows it: groups of four joined by dashes."""
    return "-".join(code[i : i + 4] for i in range(0, len(code), 4))


def migrate_and_seed_demo(db_url: str, users: int, seed: int = 12) -> None:
    """Migrate for the birthday job and add ``users`` demo users, in-process."""

    async def go() -> None:
        database = await connect(db_url, create=True)
        try:
            store = Store(database)
            await store.migrate([Birthday()])
            await seed_users(store, users, seed=seed)
        finally:
            await database.close()

    asyncio.run(go())

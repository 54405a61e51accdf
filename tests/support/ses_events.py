"""SES notification samples (events/ses/) and a June run whose users they bounce."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchrun.db import Store, connect
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import valid_address
from batchrun.runtime import Options, Runtime
from support import EVENTS
from support.birthday import seed_users
from support.db import query
from support.periods import month

SES = EVENTS / "ses"
JUNE = month(2025, 6)


def sample(name: str, *, address: str = "nobody@example.com", entity: int = 0) -> str:
    """A sample event file with its address, entity id and SES message id filled in."""
    text = (SES / f"{name}.json").read_text()
    return (
        text.replace("ADDRESS", address)
        .replace("ENTITY", str(entity))
        .replace("SESID", f"SESID{entity}")
    )


def mailed(db_url: str) -> list[tuple[int, str]]:
    """(id, address) of June's users the run mailed, in id order."""
    rows = query(
        db_url,
        "SELECT u.id, u.email FROM user u JOIN batchrun_ledger l ON l.entity_id = u.id "
        "WHERE l.job = 'birthday' AND l.period = '2025-06' AND l.state = 1 ORDER BY u.id",
    )
    return [(int(r[0]), str(r[1])) for r in rows if valid_address(str(r[1]))]


async def mailed_run(make_job: Callable[..., Any], db_url: str, users: int = 120) -> Runtime:
    """A migrated database whose June birthday run has sent (to files)."""
    database = await connect(db_url, create=True)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        await seed_users(store, users, seed=3)
    finally:
        await database.close()
    runtime: Runtime = await make_job(db_url)
    summary = await runtime.run(JUNE, Options(concurrency=4))
    assert summary.succeeded >= 4, summary
    return runtime

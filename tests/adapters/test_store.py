"""One store suite, run against a SQLite file and a real MySQL/MariaDB database."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any
from urllib.parse import urlsplit

import aiomysql
import pytest
from support.birthday import birthday_scope, seed_users, status_of
from support.db import query
from support.periods import month

from batchrun.db import Store, connect
from batchrun.db.mysql import QuietCursor
from batchrun.db.store import Scope, State, now_ms
from batchrun.effects.sending import Sender
from batchrun.job import Context
from batchrun.jobs.birthday import Birthday, codes
from batchrun.pipeline.reports import Summary
from batchrun.queue.local import LocalQueue
from batchrun.runtime import Runtime
from batchrun.settings import Settings

S1 = Scope("birthday", "2025", "2025-01")


async def test_migrate_twice_applies_nothing_new(store: Store) -> None:
    assert await store.migrate([Birthday()]) == []
    await store.check_migrated([Birthday()])


async def birthday_rt(
    store: Store, db_url: str, summary: Summary | None = None
) -> tuple[Runtime, Context]:
    rt = Runtime(Birthday(), store, None, None, Settings(db_url=db_url))
    ctx = Context(
        rt.job,
        month(2025, 6),
        store.jobdb,
        Sender(
            None,
            rt.settings,
            summary=summary or Summary("birthday", "2025-06", False),
            lease=None,
            stop=rt.stop,
            limiter=None,
            templates=None,
            sender=rt.settings.sender_for(rt.job),
        ),
    )
    return rt, ctx


async def test_birthday_page_is_a_keyset_over_the_month(store: Store, db_url: str) -> None:
    await seed_users(store, 3000, seed=2)
    rt, ctx = await birthday_rt(store, db_url)
    expected = [
        r[0]
        for r in query(
            db_url,
            "SELECT id FROM user WHERE birth_month = 6 AND status = 10 "
            "AND email IS NOT NULL ORDER BY id",
        )
    ]
    seen: list[int] = []
    after = 0
    while rows := await rt.job.page(ctx, after, 37):
        assert len(rows) <= 37
        seen += [r["id"] for r in rows]
        after = rows[-1]["id"]
    assert seen == expected and len(seen) > 100


async def test_claims_partition_entities_between_two_owners(store: Store) -> None:
    ids = list(range(1, 201))
    a, b = await asyncio.gather(
        store.claim(S1, ids=ids, new_ids=ids, me="a" * 32, lease_ms=60_000),
        store.claim(S1, ids=ids, new_ids=ids, me="b" * 32, lease_ms=60_000),
    )
    owners = {uid: c.owner for uid, c in {**a, **b}.items()}
    assert set(owners) == set(ids)
    mine_a = {u for u, c in a.items() if c.owner == "a" * 32}
    mine_b = {u for u, c in b.items() if c.owner == "b" * 32}
    assert mine_a.isdisjoint(mine_b) and mine_a | mine_b == set(ids)


async def test_expired_lease_is_taken_over_and_a_live_one_is_not(store: Store) -> None:
    ids = [1, 2, 3]
    await store.claim(S1, ids=ids, new_ids=ids, me="dead", lease_ms=-1)
    await store.claim(S1, ids=[4], new_ids=[4], me="alive", lease_ms=60_000)
    claims = await store.claim(S1, ids=[1, 2, 3, 4], new_ids=[], me="new", lease_ms=60_000)
    assert {u: c.owner for u, c in claims.items()} == {1: "new", 2: "new", 3: "new", 4: "alive"}


async def test_only_the_owner_finishes_and_final_states_are_never_reclaimed(
    store: Store,
) -> None:
    await store.claim(S1, ids=[1, 2], new_ids=[1, 2], me="a", lease_ms=-1)
    assert await store.finish(S1, ids=[1, 2], me="b", state=State.SUCCEEDED) == 0
    assert await store.finish(S1, ids=[1], me="a", state=State.SUCCEEDED) == 1
    claims = await store.claim(S1, ids=[1, 2], new_ids=[], me="c", lease_ms=60_000)
    assert claims[1].owner is None and claims[1].state == State.SUCCEEDED
    assert claims[2].owner == "c"


async def test_heartbeat_extends_and_release_lets_go(store: Store) -> None:
    await store.claim(S1, ids=[1, 2], new_ids=[1, 2], me="a", lease_ms=10)
    assert await store.heartbeat(S1, lo=1, hi=2, me="a", lease_ms=60_000) == 2
    claims = await store.claims_of(S1, [1, 2])
    assert all((c.lease_until or 0) > now_ms() + 50_000 for c in claims.values())
    await store.release(S1, ids=[1], me="a")
    claims = await store.claims_of(S1, [1, 2])
    assert claims[1].owner is None and claims[2].owner == "a"
    assert await store.heartbeat(S1, lo=1, hi=2, me="a", lease_ms=60_000) == 1


async def test_ledger_scopes_keep_jobs_and_periods_apart(store: Store) -> None:
    day = Scope("renewal", "2025-06-01", "2025-06-01")
    await store.claim(S1, ids=[7], new_ids=[7], me="a", lease_ms=60_000)
    claims = await store.claim(day, ids=[7], new_ids=[7], me="b", lease_ms=60_000)
    assert claims[7].owner == "b"  # the same id in another job is another entity
    await store.finish(day, ids=[7], me="b", state=State.SUCCEEDED)
    assert (await store.claims_of(S1, [7]))[7].state == State.PENDING


async def test_prepare_creates_cards_once_per_idempotency_key(store: Store, db_url: str) -> None:
    await seed_users(store, 300, seed=1)
    rt, ctx = await birthday_rt(store, db_url)
    rows = await rt.job.page(ctx, 0, 20)
    await rt.job.prepare(ctx, rows)
    first = {r["id"]: r.get("code") for r in rows}
    again = await rt.job.page(ctx, 0, 20)
    await rt.job.prepare(ctx, again)
    assert {r["id"]: r.get("code") for r in again} == first
    keys = query(db_url, "SELECT idempotency_key FROM gift_card")
    assert len(keys) == len({k for (k,) in keys}) == sum(1 for c in first.values() if c)


async def test_gift_code_collision_is_retried_with_a_fresh_code(
    store: Store,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await seed_users(store, 50, seed=1)
    taken = "TAKEN0TAKEN0TAKE"
    query(
        db_url,
        "INSERT INTO gift_card (recipient_email, message, status, scheduled_at, gift_code, "
        "idempotency_key) VALUES (%s, %s, %s, %s, %s, %s)",
        "x@example.com",
        "hi",
        1,
        "2025-06-01 00:00:00",
        taken,
        "other:1",
    )
    pool = [taken, *[codes.new_code() for _ in range(10)]]
    fresh = iter(pool)
    monkeypatch.setattr(codes, "new_codes", lambda n: [next(fresh) for _ in range(n)])
    summary = Summary("birthday", "2025-06", False)
    rt, ctx = await birthday_rt(store, db_url, summary)
    rows = await rt.job.page(ctx, 0, 1)
    await rt.job.prepare(ctx, rows)
    assert rows[0]["code"] == pool[1]  # the taken code, then one fresh draw
    assert summary.counters == {"cards_created": 1}


async def test_status_counts_follow_the_ledger(store: Store, db_url: str) -> None:
    await seed_users(store, 2000, seed=5)
    rt, _ = await birthday_rt(store, db_url)
    ids = [
        r[0]
        for r in query(
            db_url,
            "SELECT id FROM user WHERE birth_month = 3 AND status = 10 AND email IS NOT NULL",
        )
    ]
    scope = birthday_scope(2025, 3)
    await store.claim(scope, ids=ids, new_ids=ids, me="m", lease_ms=60_000)
    await store.finish(scope, ids=ids[:3], me="m", state=State.SUCCEEDED)
    await store.finish(scope, ids=ids[3:4], me="m", state=State.SKIPPED, error="bad")
    await store.finish(scope, ids=ids[4:5], me="m", state=State.FAILED, error="550")
    await store.finish(scope, ids=ids[5:6], me="m", state=State.RETRYING, error="451")
    status = await status_of(rt, month(2025, 3))
    assert (status.emails_sent, status.skipped, status.failed_permanent, status.retrying) == (
        3,
        1,
        1,
        1,
    )
    assert status.pending == len(ids) - 5  # retrying still counts as pending
    assert {p[0] for p in status.problems} == set(ids[3:6])


# -- the local retry queue ------------------------------------------------------------------


@pytest.fixture
def queue(store: Store) -> LocalQueue:
    return LocalQueue(store.db, max_receives=3)


async def test_queue_hides_received_messages_until_visibility_expires(
    queue: LocalQueue,
) -> None:
    await queue.send(["a", "b", "c"])
    got = await queue.receive(max_messages=2, visibility_s=60)
    assert [g.body for g in got] == ["a", "b"]
    assert all(g.receive_count == 1 for g in got)
    rest = await queue.receive(max_messages=10, visibility_s=60)
    assert [g.body for g in rest] == ["c"]
    assert await queue.receive(max_messages=10, visibility_s=60) == []
    await queue.retry_later(got[0], 0)
    again = await queue.receive(max_messages=10, visibility_s=60)
    assert [(g.body, g.receive_count) for g in again] == [("a", 2)]
    await queue.delete([*again, got[1], *rest])
    assert await queue.depths() == (0, 0)


async def test_queue_dead_letters_and_counts(queue: LocalQueue) -> None:
    await queue.send(["x"])
    await queue.send_dead([("y", "550 no such user")])
    (item,) = await queue.receive(max_messages=10, visibility_s=60)
    await queue.dead_letter(item, "poison")
    assert await queue.depths() == (0, 2)
    assert await queue.receive(max_messages=10, visibility_s=0) == []


async def test_two_consumers_never_receive_the_same_message(db_url: str, store: Store) -> None:
    await LocalQueue(store.db).send([f"m{i}" for i in range(200)])
    databases = [await connect(db_url, pool_size=2) for _ in range(3)]
    try:
        queues = [LocalQueue(d) for d in databases]

        async def drain(q: LocalQueue) -> list[str]:
            bodies: list[str] = []
            while got := await q.receive(max_messages=7, visibility_s=60):
                bodies.extend(g.body for g in got)
            return bodies

        results: list[Any] = await asyncio.gather(*(drain(q) for q in queues))
    finally:
        for d in databases:
            await d.close()
    everything = [b for r in results for b in r]
    assert sorted(everything) == sorted(f"m{i}" for i in range(200))


async def test_mysql_escaping_matches_the_drivers_own(mysql_url: str) -> None:
    """The cursor's int fast path gives the very literals aiomysql would, for any value."""
    url = urlsplit(mysql_url)
    conn = await aiomysql.connect(
        host=url.hostname,
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        db=url.path.lstrip("/"),
        charset="utf8mb4",
    )
    try:
        values = (
            0,
            -7,
            2**63 - 1,
            True,
            False,
            None,
            "plain",
            'it\'s "quoted" \\ and ;--',
            "naïve ☃",
            1.5,
            datetime.date(2025, 6, 1),
            # Repeats, escaped once per statement; values equal to 1 of other types.
            "plain",
            1,
            1.0,
            True,
            -7,
            "".join(map(chr, range(1, 256))),  # every character pymysql escapes, and more
            *map(chr, range(256)),  # each alone: a text with one character to escape, or none
            "addr\0ess",
        )
        # mogrify: the very statement execute() sends, built by each cursor's own escaping;
        # then again with NO_BACKSLASH_ESCAPES, where a quote is doubled instead.
        for sql_mode in ("", ", 'NO_BACKSLASH_ESCAPES'"):
            async with conn.cursor() as setup:
                await setup.execute(f"SET SESSION sql_mode = CONCAT_WS(',', @@sql_mode{sql_mode})")
            async with conn.cursor(aiomysql.Cursor) as plain:
                theirs = [plain.mogrify("%s", (value,)) for value in values]
                whole = plain.mogrify(", ".join(["%s"] * len(values)), values)
            async with conn.cursor(QuietCursor) as cur:
                mine = [cur.mogrify("%s", (value,)) for value in values]
                assert mine == theirs
                assert cur.mogrify(", ".join(["%s"] * len(values)), values) == whole
                assert mine[0] == "0" and mine[3] == theirs[3]
                await cur.execute("SELECT " + ", ".join(["%s"] * len(values)), values)
                row = await cur.fetchone()
            assert row[0] == 0 and row[2] == 2**63 - 1 and row[7] == 'it\'s "quoted" \\ and ;--'
            assert row[16] == "".join(map(chr, range(1, 256)))
            assert list(row[17:-1]) == list(map(chr, range(256))) and row[-1] == "addr\0ess"
        assert "''" in mine[7]  # the second round did run without backslash escapes
    finally:
        conn.close()


async def test_a_pages_ledger_insert_is_prepared_once_on_postgresql(postgres_url: str) -> None:
    """A page's multi-row claim insert (38 KB for 500 rows) stays in asyncpg's statement
    cache: the server holds it as one named prepared statement after two pages, where
    asyncpg's 15 KB default prepared it anew, unnamed, on every page."""
    database = await connect(postgres_url, create=True, pool_size=1)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        for first in (1, 501):
            ids = list(range(first, first + 500))
            claims = await store.claim(S1, ids=ids, new_ids=ids, me="run-a", lease_ms=60_000)
            assert len(claims) == 500
        named = await database.fetch_sql(
            "SELECT COUNT(*) FROM pg_prepared_statements"
            " WHERE statement LIKE 'INSERT INTO batchrun_ledger%'",
            (),
        )
        assert named[0][0] == 1
    finally:
        await database.close()

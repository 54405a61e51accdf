"""The example jobs' logic (examples/renewal, examples/credits) against a fake Context.

The Context is batchrun's own; only what the runtime lends it is faked: ``db`` runs the
job's SQL on a real database (a SQLite file, and MySQL when the server is there) migrated
with the job's own steps, and the effects record emails and counters. The credits job
talks to a real HTTP server (tests/http_server.py). The guarantees under real runs
(claims, ledger, crashes) belong to the runtime's suite, not here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import socket
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import psycopg.rows
import pymysql
import pymysql.cursors
import pytest
from conftest import ROOT, mysql_connect, pg_connect
from http_server import GrantsTestServer

import batchrun
from batchrun.db import connect
from batchrun.db.sql import PLACEHOLDERS, Queries
from batchrun.db.sqlite import sqlite_path


def load_example(name: str) -> ModuleType:
    """Import ``examples/NAME/NAME.py`` by its path (examples/ is not a package)."""
    path = ROOT / "examples" / name / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"batchrun_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


renewal = load_example("renewal")
credits = load_example("credits")

RUN_DAY = dt.date(2025, 6, 1)
RENEWS = "2025-06-08"  # RUN_DAY + 7


class FakeDb:
    """``ctx.db`` over one real connection: sqlite3 for SQLite, pymysql for MySQL, psycopg
    for PostgreSQL (``%s`` placeholders, as pymysql's)."""

    def __init__(self, url: str) -> None:
        self.dialect = "sqlite" if url.startswith("sqlite") else "mysql"
        if url.startswith("postgres"):
            self.dialect = "postgresql"
        mark = "%s" if self.dialect == "postgresql" else PLACEHOLDERS[self.dialect]
        self.queries = Queries(self.dialect, mark, {})
        if self.dialect == "sqlite":
            self.conn: Any = sqlite3.connect(sqlite_path(url), isolation_level=None)
            self.conn.row_factory = sqlite3.Row
        elif self.dialect == "postgresql":
            self.conn = pg_connect(url)
            self.conn.row_factory = psycopg.rows.dict_row
        else:
            self.conn = mysql_connect(url)

    def _run(self, sql: str, params: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        text, args = self.queries.compile_text(sql, sql, params)
        if self.dialect == "sqlite":
            cur = self.conn.execute(text, args)
            rows = [dict(r) for r in cur.fetchall()]
            return cur.rowcount, rows
        if self.dialect == "postgresql":
            cur = self.conn.execute(text, args)
            return cur.rowcount, list(cur.fetchall()) if cur.description else []
        with self.conn.cursor(pymysql.cursors.DictCursor) as cur:
            count = cur.execute(text, args)
            return count, list(cur.fetchall())

    async def fetch(self, sql: str, /, **params: Any) -> list[dict[str, Any]]:
        return self._run(sql, params)[1]

    async def execute(self, sql: str, /, **params: Any) -> int:
        return self._run(sql, params)[0]

    def close(self) -> None:
        self.conn.close()


class FakeEffects:
    """What the runtime lends a Context, recorded: emails sent and counters."""

    def __init__(self) -> None:
        self.emails: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()

    async def send_email(self, ctx: batchrun.Context, **fields: Any) -> None:
        self.emails.append({"key": ctx.key, **fields})

    def count(self, name: str, n: int) -> None:
        self.counts[name] += n


async def migrate(url: str, folder: batchrun.SqlFolder) -> list[str]:
    """Apply a job's schema steps as ``batchrun db migrate`` does: guards decide."""
    database = await connect(url, create=True)
    applied = []
    try:
        for step in folder.migration_steps(database.dialect):
            if not any([await database.guard_holds(guard) for guard in step.unless]):
                await database.run_step(step)
                applied.append(step.name)
            for guard in step.unless:  # a wrong guard would rerun the step on every migrate
                assert await database.guard_holds(guard), f"{step.name}: {guard} not holding"
    finally:
        await database.close()
    return applied


@pytest.fixture
async def make_db() -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``await make_db(url, job_class)`` -> a FakeDb on a migrated database."""
    opened: list[FakeDb] = []

    async def make(url: str, job: type[batchrun.Job]) -> FakeDb:
        assert job.sql is not None
        assert await migrate(url, job.sql), "a fresh database got no step"
        assert await migrate(url, job.sql) == [], "a second migrate ran a step again"
        db = FakeDb(url)
        opened.append(db)
        return db

    yield make
    for db in opened:
        db.close()


def make_ctx(job: batchrun.Job, db: FakeDb, period: batchrun.Period) -> batchrun.Context:
    return batchrun.Context(job, period, db, FakeEffects())


def effects(ctx: batchrun.Context) -> FakeEffects:
    return ctx._effects  # type: ignore[return-value]


# -- renewal ---------------------------------------------------------------------------------


@pytest.fixture
async def renewal_ctx(db_url: str, make_db: Callable[..., Any]) -> batchrun.Context:
    db = await make_db(db_url, renewal.RenewalReminder)
    accounts = [  # (id, contact, name, renews_on, active), not in id order
        (9, "i@example.com", "Ida", RENEWS, 1),
        (1, "a@example.com", "Ann", RENEWS, 1),
        (2, "b@example.com", "Bob", "2025-06-07", 1),  # renews a day early
        (3, "c@example.com", "Cy", RENEWS, 0),  # inactive
        (4, None, "Dee", RENEWS, 1),  # no address: selected, then skipped by process
        (8, "h@example.com", "Hal", RENEWS, 1),
        (5, "e@example.com", "Eve", RENEWS, 1),
        (7, "g@example.com", "Gus", "2025-06-09", 1),  # a day late
    ]
    await db.execute(
        "INSERT INTO account (id, contact, name, renews_on, active) VALUES :rows", rows=accounts
    )
    if db.dialect == "postgresql":  # explicit ids do not move an identity column's sequence
        await db.fetch("SELECT setval(pg_get_serial_sequence('account', 'id'), 9)")
    return make_ctx(renewal.RenewalReminder(), db, batchrun.Period(RUN_DAY, "day"))


async def test_renewal_pages_the_accounts_renewing_in_a_week_in_id_order(
    renewal_ctx: batchrun.Context,
) -> None:
    job = renewal_ctx.job
    pages, after = [], 0
    while rows := await job.page(renewal_ctx, after=after, limit=2):
        assert len(rows) <= 2
        pages.append([row["id"] for row in rows])
        after = rows[-1]["id"]
    assert pages == [[1, 4], [5, 8], [9]]
    assert (await job.page(renewal_ctx, after=0, limit=1))[0] == {
        "id": 1,
        "email": "a@example.com",
        "name": "Ann",
    }
    # batchrun re-checks one entity with page(after=id - 1, limit=1)
    assert [r["id"] for r in await job.page(renewal_ctx, after=4, limit=1)] == [5]
    assert [r["id"] for r in await job.page(renewal_ctx, after=2, limit=1)] == [4]


async def test_renewal_page_is_an_index_range(renewal_ctx: batchrun.Context) -> None:
    db = renewal_ctx.db
    # Enough accounts on other days that a scan in id order is the worse plan.
    start = dt.date(2025, 7, 1)
    rows = [
        (f"x{i}@example.com", f"X{i}", (start + dt.timedelta(days=i % 90)).isoformat(), 1)
        for i in range(3000)
    ]
    await db.execute(
        "INSERT INTO account (contact, name, renews_on, active) VALUES :rows", rows=rows
    )
    await db.execute(
        {"sqlite": "ANALYZE", "postgresql": "ANALYZE account"}.get(
            db.dialect, "ANALYZE TABLE account"
        )
    )
    sql = renewal_ctx.sql("page")
    params = {"day": RENEWS, "after": 0, "limit": 100}
    if db.dialect == "sqlite":
        plan = " ".join(r["detail"] for r in await db.fetch("EXPLAIN QUERY PLAN " + sql, **params))
        assert "USING INDEX idx_account_renews_on_active_id" in plan, plan
    elif db.dialect == "postgresql":
        plan = " ".join(r["QUERY PLAN"] for r in await db.fetch("EXPLAIN " + sql, **params))
        # An index scan, or for these few rows a bitmap one over the same index range.
        index = "idx_account_renews_on_active_id"
        assert f"Index Scan using {index}" in plan or f"Index Scan on {index}" in plan, plan
        assert "Seq Scan" not in plan, plan
    else:
        (row,) = await db.fetch("EXPLAIN " + sql, **params)
        assert row["key"] == "idx_account_renews_on_active_id", row


async def test_renewal_emails_through_its_template(renewal_ctx: batchrun.Context) -> None:
    (row,) = await renewal_ctx.job.page(renewal_ctx, after=0, limit=1)
    await renewal_ctx.job.process(renewal_ctx.entity(row["id"]), row)
    assert effects(renewal_ctx).emails == [
        {
            "key": "renewal:2025-06-01:1",
            "to": "a@example.com",
            "subject": None,
            "text": None,
            "html": None,
            "to_name": "Ann",
            "template": "renewal",
            "variables": {"name": "Ann", "renews_on": dt.date(2025, 6, 8)},
        }
    ]


@pytest.mark.parametrize("contact", [None, ""])
async def test_renewal_without_an_address_is_skipped(contact: str | None) -> None:
    ctx = make_ctx(renewal.RenewalReminder(), None, batchrun.Period(RUN_DAY, "day"))  # type: ignore[arg-type]
    with pytest.raises(batchrun.Skip, match="no address"):
        await ctx.job.process(ctx.entity(4), {"id": 4, "email": contact, "name": "Dee"})
    assert effects(ctx).emails == []


def test_renewal_templates_render() -> None:
    jinja2 = pytest.importorskip("jinja2")
    folder = ROOT / "examples" / "renewal" / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    variables = {"name": "Ann <& Co>", "renews_on": dt.date(2025, 6, 8)}
    subject, text, html = (
        env.get_template(f"renewal/{part}").render(**variables)
        for part in ("subject.txt", "body.txt", "body.html")
    )
    assert subject == "Your plan renews on June 8"
    assert "Hello Ann <& Co>," in text
    assert "Sunday, June 8, 2025" in text
    assert "Ann &lt;&amp; Co&gt;" in html and "<& Co>" not in html
    assert html.startswith("<!doctype html>")


# -- credits ---------------------------------------------------------------------------------

MONTH = batchrun.Period(dt.date(2025, 6, 1), "month")
KEY = "credits:2025-06:42"
CUSTOMER = {"id": 42, "email": "c42@example.com", "plan": "pro"}


@pytest.fixture(scope="session")
def grants_server_session() -> Iterator[GrantsTestServer]:
    with GrantsTestServer() as server:
        yield server


@pytest.fixture
def grants_server(grants_server_session: GrantsTestServer) -> GrantsTestServer:
    grants_server_session.reset()
    return grants_server_session


@pytest.fixture
async def make_credits(
    grants_server: GrantsTestServer,
) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``make_credits(CREDITS_API_URL=...)`` -> a credits job, closed afterwards."""
    jobs: list[Any] = []

    def make(**environ: str) -> Any:
        job = credits.MonthlyCredits(
            {"CREDITS_API_URL": grants_server.url, "CREDITS_API_TIMEOUT_S": "2", **environ}
        )
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        await job.aclose()


@pytest.fixture
async def credits_ctx(
    sqlite_url: str, make_db: Callable[..., Any], make_credits: Callable[..., Any]
) -> batchrun.Context:
    db = await make_db(sqlite_url, credits.MonthlyCredits)
    return make_ctx(make_credits(), db, MONTH).entity(42)


async def grants(ctx: batchrun.Context) -> list[dict[str, Any]]:
    return await ctx.db.fetch(
        "SELECT idempotency_key, customer_id, amount, api_grant_id FROM credit_grant"
    )


async def test_credits_pages_active_customers_in_id_order(
    db_url: str, make_db: Callable[..., Any], make_credits: Callable[..., Any]
) -> None:
    db = await make_db(db_url, credits.MonthlyCredits)
    for cid, active in [(1, 1), (2, 0), (3, 1), (5, 1), (6, 1)]:
        await db.execute(
            "INSERT INTO customer (id, email, plan, active) VALUES (:id, :email, 'pro', :a)",
            id=cid,
            email=f"c{cid}@example.com",
            a=active,
        )
    ctx = make_ctx(make_credits(), db, MONTH)
    first = await ctx.job.page(ctx, after=0, limit=2)
    assert first == [
        {"id": 1, "email": "c1@example.com", "plan": "pro"},
        {"id": 3, "email": "c3@example.com", "plan": "pro"},
    ]
    assert [r["id"] for r in await ctx.job.page(ctx, after=3, limit=2)] == [5, 6]
    assert await ctx.job.page(ctx, after=6, limit=2) == []


async def test_credits_grants_once_and_records_it(
    db_url: str,
    make_db: Callable[..., Any],
    make_credits: Callable[..., Any],
    grants_server: GrantsTestServer,
) -> None:
    db = await make_db(db_url, credits.MonthlyCredits)
    ctx = make_ctx(make_credits(), db, MONTH).entity(42)
    await ctx.job.process(ctx, dict(CUSTOMER))
    assert await grants(ctx) == [
        {"idempotency_key": KEY, "customer_id": 42, "amount": 500, "api_grant_id": "g1"}
    ]
    assert effects(ctx).counts == Counter({"credits_granted": 1})
    (call,) = grants_server.calls()
    assert call.key == KEY
    assert call.body == {"customer_id": 42, "amount": 500, "period": "2025-06"}
    # A rerun (the ledger missed the success) reads the row and does not call again.
    await ctx.job.process(ctx, dict(CUSTOMER))
    assert grants_server.calls_per_key() == Counter({KEY: 1})
    assert effects(ctx).counts == Counter({"credits_granted": 1})
    assert len(await grants(ctx)) == 1


async def test_credits_with_a_recorded_grant_does_not_call_the_api(
    credits_ctx: batchrun.Context, grants_server: GrantsTestServer
) -> None:
    await credits_ctx.db.execute(
        credits_ctx.sql("record_grant"), key=KEY, customer_id=42, amount=500, api_grant_id="g-old"
    )
    await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert grants_server.calls() == []
    assert effects(credits_ctx).counts == Counter()
    assert [g["api_grant_id"] for g in await grants(credits_ctx)] == ["g-old"]


async def test_credits_429_retries_after_what_the_api_asks(
    credits_ctx: batchrun.Context, grants_server: GrantsTestServer
) -> None:
    grants_server.answer_next(1, 429, retry_after=7)
    grants_server.answer_next(1, 429)
    with pytest.raises(batchrun.Retry, match="429") as first:
        await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert first.value.delay_s == 7.0
    with pytest.raises(batchrun.Retry, match="429") as second:
        await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert second.value.delay_s is None
    assert await grants(credits_ctx) == []
    # The API recovers: the retry grants once.
    await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert grants_server.calls_per_key() == Counter({KEY: 3})
    assert grants_server.grants_per_key() == Counter({KEY: 1})
    assert len(await grants(credits_ctx)) == 1


@pytest.mark.parametrize("status", [500, 502, 503, 408])
async def test_credits_server_errors_retry(
    credits_ctx: batchrun.Context, grants_server: GrantsTestServer, status: int
) -> None:
    grants_server.answer_next(1, status)
    with pytest.raises(batchrun.Retry, match=str(status)) as raised:
        await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert raised.value.delay_s is None
    assert await grants(credits_ctx) == []
    assert effects(credits_ctx).counts == Counter()


@pytest.mark.parametrize("status", [400, 401, 404, 409, 422])
async def test_credits_client_errors_fail(
    credits_ctx: batchrun.Context, grants_server: GrantsTestServer, status: int
) -> None:
    grants_server.answer_next(1, status)
    with pytest.raises(batchrun.Fail, match=f"HTTP {status} from"):
        await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert await grants(credits_ctx) == []


async def test_credits_wrong_path_fails(
    sqlite_url: str,
    make_db: Callable[..., Any],
    make_credits: Callable[..., Any],
    grants_server: GrantsTestServer,
) -> None:
    db = await make_db(sqlite_url, credits.MonthlyCredits)
    job = make_credits(CREDITS_API_URL=f"{grants_server.url}/v2")  # the server knows /grants
    ctx = make_ctx(job, db, MONTH).entity(42)
    with pytest.raises(batchrun.Fail, match=r"HTTP 404 from .*/v2/grants"):
        await ctx.job.process(ctx, dict(CUSTOMER))
    assert grants_server.calls() == []


async def test_credits_timeout_retries(
    sqlite_url: str,
    make_db: Callable[..., Any],
    make_credits: Callable[..., Any],
    grants_server: GrantsTestServer,
) -> None:
    db = await make_db(sqlite_url, credits.MonthlyCredits)
    ctx = make_ctx(make_credits(CREDITS_API_TIMEOUT_S="0.2"), db, MONTH).entity(42)
    grants_server.delay(5.0, n=1)
    with pytest.raises(batchrun.Retry, match="ReadTimeout"):
        await ctx.job.process(ctx, dict(CUSTOMER))
    assert await grants(ctx) == []


async def test_credits_unreachable_api_retries(
    sqlite_url: str, make_db: Callable[..., Any], make_credits: Callable[..., Any]
) -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = await make_db(sqlite_url, credits.MonthlyCredits)
    ctx = make_ctx(make_credits(CREDITS_API_URL=f"http://127.0.0.1:{port}"), db, MONTH)
    with pytest.raises(batchrun.Retry, match="ConnectError"):
        await ctx.job.process(ctx.entity(42), dict(CUSTOMER))


async def test_credits_success_without_a_grant_id_fails_rather_than_grant_twice(
    credits_ctx: batchrun.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    sent = httpx.Request("POST", "http://127.0.0.1/grants")  # raise_for_status reads it
    answers = iter(
        [
            httpx.Response(200, text="ok", request=sent),
            httpx.Response(201, json={"grant": "g1"}, request=sent),
            httpx.Response(201, json={"id": None}, request=sent),
            httpx.Response(201, json=["g1"], request=sent),
        ]
    )

    async def post(*args: Any, **kwargs: Any) -> httpx.Response:
        return next(answers)

    monkeypatch.setattr(credits_ctx.job.client(), "post", post)
    for _ in range(4):
        with pytest.raises(batchrun.Fail, match="without a grant id"):
            await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert await grants(credits_ctx) == []


async def test_credits_unknown_plan_is_skipped_without_a_call(
    credits_ctx: batchrun.Context, grants_server: GrantsTestServer
) -> None:
    with pytest.raises(batchrun.Skip, match="plan 'legacy'"):
        await credits_ctx.job.process(credits_ctx, {**CUSTOMER, "plan": "legacy"})
    assert grants_server.calls() == []


async def test_credits_retried_until_done_grant_each_customer_once(
    sqlite_url: str,
    make_db: Callable[..., Any],
    make_credits: Callable[..., Any],
    grants_server: GrantsTestServer,
) -> None:
    db = await make_db(sqlite_url, credits.MonthlyCredits)
    run = make_ctx(make_credits(), db, MONTH)
    customers = [{"id": i, "email": f"c{i}@example.com", "plan": "starter"} for i in range(1, 21)]
    grants_server.answer_fraction(0.4, 503, seed=3)
    pending, rounds = customers, 0
    while pending and rounds < 20:
        rounds += 1
        outcomes = await asyncio.gather(
            *(run.job.process(run.entity(c["id"]), c) for c in pending), return_exceptions=True
        )
        assert all(o is None or isinstance(o, batchrun.Retry) for o in outcomes), outcomes
        pending = [c for c, o in zip(pending, outcomes, strict=True) if o is not None]
    assert pending == [] and rounds > 1
    assert set(grants_server.grants_per_key().values()) == {1}
    assert len(grants_server.grants_per_key()) == 20
    assert effects(run).counts == Counter({"credits_granted": 20})
    assert len(await grants(run)) == 20


async def test_credits_client_is_made_once_per_event_loop(
    make_credits: Callable[..., Any], grants_server: GrantsTestServer
) -> None:
    job = make_credits()
    mine = job.client()
    assert job.client() is mine
    assert str(mine.base_url).rstrip("/") == grants_server.url

    async def in_another_loop() -> Any:
        return job.client()

    # A warm Lambda runs each invocation in a new loop: a client bound to the old one
    # would fail there, so the new loop gets its own.
    other = await asyncio.to_thread(asyncio.run, in_another_loop())
    assert other is not mine


@pytest.mark.parametrize(
    ("header", "delay"),
    [
        ("7", 7.0),
        (" 0 ", 0.0),
        ("-1", None),
        ("1.5", None),
        ("inf", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: at once
    ],
)
async def test_credits_retry_after_header(
    credits_ctx: batchrun.Context,
    grants_server: GrantsTestServer,
    header: str,
    delay: float | None,
) -> None:
    grants_server.answer_next(1, 429, retry_after=header)
    grants_server.answer_next(1, 429)
    with pytest.raises(batchrun.Retry, match="429") as first:
        await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert first.value.delay_s == delay
    with pytest.raises(batchrun.Retry, match="429") as second:
        await credits_ctx.job.process(credits_ctx, dict(CUSTOMER))
    assert second.value.delay_s is None


def test_examples_are_loaded_from_their_files() -> None:
    assert Path(renewal.__file__).parent.name == "renewal"
    assert renewal.RenewalReminder.sql is not None
    assert credits.MonthlyCredits.name == "credits"

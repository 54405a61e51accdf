"""The example jobs (examples/renewal, examples/credits), tested as their authors would:
with ``batchrun.testing`` only, on a database migrated with the job's own steps (SQLite,
and MariaDB and PostgreSQL where ``db_url`` says so), a mailbox, and for credits an
``HttpDouble`` standing in for the credits API. The guarantees under concurrent runs and
crashes belong to the runtime's suite (tests/guarantees/test_every_job.py), not here.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from support import ROOT
from support.ports import free_port

import batchrun
from batchrun.testing import Harness, HttpDouble, LedgerEntry, Request


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

RUN_DAY = "2025-06-01"
RENEWS = "2025-06-08"  # RUN_DAY + 7


# -- renewal ---------------------------------------------------------------------------------

ACCOUNTS = [  # (id, contact, name, renews_on, active), not in id order
    (9, "i@example.com", "Ida", RENEWS, 1),
    (1, "a@example.com", "Ann", RENEWS, 1),
    (2, "b@example.com", "Bob", "2025-06-07", 1),  # renews a day early
    (3, "c@example.com", "Cy", RENEWS, 0),  # inactive
    (4, None, "Dee", RENEWS, 1),  # no address: selected, then skipped by process
    (8, "h@example.com", "Hal", RENEWS, 1),
    (5, "e@example.com", "Eve", RENEWS, 1),
    (7, "g@example.com", "Gus", "2025-06-09", 1),  # a day late
]


def add_accounts(h: Harness, rows: list[tuple[Any, ...]]) -> None:
    h.execute("INSERT INTO account (id, contact, name, renews_on, active) VALUES :rows", rows=rows)
    if h.dialect == "postgresql":  # explicit ids do not move an identity column's sequence
        h.fetch("SELECT setval(pg_get_serial_sequence('account', 'id'), 9)")


@pytest.fixture
def renewals(db_url: str) -> Iterator[Harness]:
    """The renewal job on a database its own steps migrated, with ACCOUNTS."""
    with Harness(renewal.RenewalReminder, db=db_url) as h:
        add_accounts(h, ACCOUNTS)
        yield h


def test_renewal_pages_the_accounts_renewing_in_a_week_in_id_order(renewals: Harness) -> None:
    pages, after = [], 0
    while rows := renewals.page(RUN_DAY, after=after, limit=2):
        assert len(rows) <= 2
        pages.append([row["id"] for row in rows])
        after = rows[-1]["id"]
    assert pages == [[1, 4], [5, 8], [9]]
    assert renewals.page(RUN_DAY, limit=1)[0] == {"id": 1, "email": "a@example.com", "name": "Ann"}
    # batchrun re-checks one entity with page(after=id - 1, limit=1)
    assert [r["id"] for r in renewals.page(RUN_DAY, after=4, limit=1)] == [5]
    assert [r["id"] for r in renewals.page(RUN_DAY, after=2, limit=1)] == [4]


def test_renewal_runs_once_per_account_and_day(renewals: Harness) -> None:
    dry = renewals.dry_run(RUN_DAY)
    summary = renewals.run(RUN_DAY)
    assert (summary.eligible, summary.succeeded, summary.skipped) == (5, 4, 1)
    assert (dry.eligible, dry.skipped) == (summary.eligible, summary.skipped)
    assert sorted(e.to for e in renewals.emails) == [
        "a@example.com",
        "e@example.com",
        "h@example.com",
        "i@example.com",
    ]
    dee = renewals.ledger(4, RUN_DAY)
    assert dee is not None and (dee.state, dee.reason) == ("skipped", "no address")
    assert renewals.ledger(2, RUN_DAY) is None  # not due this day: never in the page
    assert renewals.run(RUN_DAY).eligible == 0
    assert renewals.run("2025-06-02").eligible == 1  # Gus, a day later


def test_renewal_page_is_an_index_range(renewals: Harness) -> None:
    # Enough accounts on other days that a scan in id order is the worse plan.
    start = dt.date(2025, 7, 1)
    rows = [
        (f"x{i}@example.com", f"X{i}", (start + dt.timedelta(days=i % 90)).isoformat(), 1)
        for i in range(3000)
    ]
    renewals.execute(
        "INSERT INTO account (contact, name, renews_on, active) VALUES :rows", rows=rows
    )
    dialect = renewals.dialect
    renewals.execute(
        {"sqlite": "ANALYZE", "postgresql": "ANALYZE account"}.get(dialect, "ANALYZE TABLE account")
    )
    assert renewal.RenewalReminder.sql is not None
    sql = renewal.RenewalReminder.sql.text(dialect, "page")
    params = {"day": RENEWS, "after": 0, "limit": 100}
    index = "idx_account_renews_on_active_id"
    if dialect == "sqlite":
        plan = " ".join(r["detail"] for r in renewals.fetch("EXPLAIN QUERY PLAN " + sql, **params))
        assert f"USING INDEX {index}" in plan, plan
    elif dialect == "postgresql":
        plan = " ".join(r["QUERY PLAN"] for r in renewals.fetch("EXPLAIN " + sql, **params))
        # An index scan, or for these few rows a bitmap one over the same index range.
        assert f"Index Scan using {index}" in plan or f"Index Scan on {index}" in plan, plan
        assert "Seq Scan" not in plan, plan
    else:
        (row,) = renewals.fetch("EXPLAIN " + sql, **params)
        assert row["key"] == index, row


def test_renewal_emails_through_its_template() -> None:
    with Harness(renewal.RenewalReminder) as h:
        add_accounts(h, ACCOUNTS)
        (row,) = h.page(RUN_DAY, limit=1)
        h.process(row, RUN_DAY)
        (email,) = h.emails
    assert (email.to, email.to_name) == ("a@example.com", "Ann")
    assert email.subject == "Your plan renews on June 8"
    assert email.message_id == "<renewal.2025-06-01.1@localhost>"
    assert email.sender == "renewal@localhost"
    assert "Hello Ann," in email.text and "Sunday, June 8, 2025" in email.text
    assert email.html is not None and "<strong>Sunday, June 8, 2025</strong>" in email.html


def test_renewal_preview_shows_one_accounts_email() -> None:
    with Harness(renewal.RenewalReminder) as h:
        add_accounts(h, ACCOUNTS)
        email = h.preview(5, RUN_DAY)
        assert (email.to, email.subject) == ("e@example.com", "Your plan renews on June 8")
        assert h.emails == [] and h.ledger(5, RUN_DAY) is None


@pytest.mark.parametrize("contact", [None, ""])
def test_renewal_without_an_address_is_skipped(contact: str | None) -> None:
    with Harness(renewal.RenewalReminder) as h:
        with pytest.raises(batchrun.Skip, match="no address"):
            h.process({"id": 4, "email": contact, "name": "Dee"}, RUN_DAY)
        assert h.emails == []


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

MONTH = "2025-06"
KEY = "credits:2025-06:42"
CUSTOMER = {"id": 42, "email": "c42@example.com", "plan": "pro"}


def granted(request: Request) -> dict[str, str]:
    """The credits API's answer to a grant: a fresh id per call (it is not idempotent)."""
    return {"id": f"g-{request.headers['Idempotency-Key']}-{id(request)}"}


@pytest.fixture
def api() -> Iterator[HttpDouble]:
    """The credits API: POST /grants answers 201 with a fresh grant id."""
    with HttpDouble() as double:
        double.respond(201, json=granted, method="POST", path="/grants")
        yield double


def credits_harness(api: HttpDouble, db: str | None = None, **env: str) -> Harness:
    environ = {**api.env("credits"), "BATCHRUN_BACKEND_CREDITS_TIMEOUT_S": "2", **env}
    return Harness(credits.MonthlyCredits, db=db, env=environ)


@pytest.fixture
def granting(api: HttpDouble) -> Iterator[Harness]:
    with credits_harness(api) as h:
        yield h


def grants(h: Harness) -> list[dict[str, Any]]:
    return h.fetch("SELECT idempotency_key, customer_id, amount, api_grant_id FROM credit_grant")


def test_credits_pages_active_customers_in_id_order(db_url: str, api: HttpDouble) -> None:
    with credits_harness(api, db=db_url) as h:
        for cid, active in [(1, 1), (2, 0), (3, 1), (5, 1), (6, 1)]:
            h.execute(
                "INSERT INTO customer (id, email, plan, active) VALUES (:id, :email, 'pro', :a)",
                id=cid,
                email=f"c{cid}@example.com",
                a=active,
            )
        assert h.page(MONTH, limit=2) == [
            {"id": 1, "email": "c1@example.com", "plan": "pro"},
            {"id": 3, "email": "c3@example.com", "plan": "pro"},
        ]
        assert [r["id"] for r in h.page(MONTH, after=3, limit=2)] == [5, 6]
        assert h.page(MONTH, after=6, limit=2) == []


def test_credits_run_grants_each_customer_once(db_url: str, api: HttpDouble) -> None:
    with credits_harness(api, db=db_url) as h:
        rows = [(i, f"c{i}@example.com", "starter", 1) for i in range(1, 8)]
        h.execute("INSERT INTO customer (id, email, plan, active) VALUES :rows", rows=rows)
        summary = h.run(MONTH)
        assert (summary.succeeded, summary.credits_granted, summary.emails_sent) == (7, 7, 0)
        assert len(grants(h)) == 7
        assert h.run(MONTH).eligible == 0
        keys = Counter(r.headers["Idempotency-Key"] for r in api.requests)
        assert keys == Counter({f"credits:2025-06:{i}": 1 for i in range(1, 8)})


def test_credits_grants_once_and_records_it(granting: Harness, api: HttpDouble) -> None:
    granting.process(dict(CUSTOMER), MONTH)
    (grant,) = grants(granting)
    assert (grant["idempotency_key"], grant["customer_id"], grant["amount"]) == (KEY, 42, 500)
    assert grant["api_grant_id"].startswith(f"g-{KEY}-")
    assert granting.counters == {"credits_granted": 1}
    (call,) = api.requests
    assert call.headers["Idempotency-Key"] == KEY
    assert call.json == {"customer_id": 42, "amount": 500, "period": "2025-06"}
    # A rerun (the ledger missed the success) reads the row and does not call again.
    granting.process(dict(CUSTOMER), MONTH)
    assert len(api.requests) == 1
    assert granting.counters == {"credits_granted": 1}
    assert len(grants(granting)) == 1


def test_credits_with_a_recorded_grant_does_not_call_the_api(
    granting: Harness, api: HttpDouble
) -> None:
    assert credits.MonthlyCredits.sql is not None
    granting.execute(
        credits.MonthlyCredits.sql.text(granting.dialect, "record_grant"),
        key=KEY,
        customer_id=42,
        amount=500,
        api_grant_id="g-old",
    )
    granting.process(dict(CUSTOMER), MONTH)
    assert api.requests == []
    assert granting.counters == {}
    assert [g["api_grant_id"] for g in grants(granting)] == ["g-old"]


def test_credits_429_retries_after_what_the_api_asks(granting: Harness, api: HttpDouble) -> None:
    api.respond(429, headers={"Retry-After": "7"}, times=1)
    api.respond(429, times=1)
    with pytest.raises(batchrun.Retry, match="429") as first:
        granting.process(dict(CUSTOMER), MONTH)
    assert first.value.delay_s == 7.0
    with pytest.raises(batchrun.Retry, match="429") as second:
        granting.process(dict(CUSTOMER), MONTH)
    assert second.value.delay_s is None
    assert grants(granting) == []
    # The API recovers: the retry grants once.
    granting.process(dict(CUSTOMER), MONTH)
    assert len(api.requests) == 3
    assert len(grants(granting)) == 1


def test_a_failed_call_is_queued_and_the_retry_grants_it(
    granting: Harness, api: HttpDouble
) -> None:
    granting.execute(
        "INSERT INTO customer (id, email, plan, active) VALUES (42, 'c42@example.com', 'pro', 1)"
    )
    api.respond(500, times=1)
    summary = granting.run(MONTH)
    assert (summary.failed, summary.queued_for_retry, summary.exit_code) == (1, 1, 3)
    entry = granting.ledger(42, MONTH)
    assert entry is not None and entry.state == "retrying" and "500" in (entry.reason or "")
    assert granting.retry().succeeded == 1
    assert granting.ledger(42, MONTH) == LedgerEntry("succeeded", 2, None)
    assert len(grants(granting)) == 1


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_credits_api_is_waited_out_in_a_run_no_attempt_counted(
    granting: Harness, api: HttpDouble, status: int
) -> None:
    granting.execute(
        "INSERT INTO customer (id, email, plan, active) VALUES (42, 'c42@example.com', 'pro', 1)"
    )
    api.respond(status, times=2)  # busy twice, then it grants
    summary = granting.run(MONTH)
    assert (summary.succeeded, summary.failed, summary.queued_for_retry) == (1, 0, 0)
    assert granting.ledger(42, MONTH) == LedgerEntry("succeeded", 1, None)  # one attempt
    figures = summary.to_json()["backends"]["credits"]
    assert (figures["calls"], figures["throttles"]) == (3, 2)
    assert figures["busy_waits"] >= 2 and figures["rate"] is not None
    assert len(grants(granting)) == 1


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_answer_called_directly_is_busy(
    granting: Harness, api: HttpDouble, status: int
) -> None:
    api.respond(status, headers={"Retry-After": "3"}, times=1)
    with pytest.raises(batchrun.Busy, match=f"HTTP {status}") as raised:
        granting.process(dict(CUSTOMER), MONTH)
    assert raised.value.delay_s == 3.0 and raised.value.backend == "credits"
    assert isinstance(raised.value, batchrun.Retry)  # what it is to code that knows no Busy
    assert grants(granting) == []


def one_customer_run(h: Harness) -> LedgerEntry | None:
    """Run the month for customer 42 alone; how it stands after."""
    h.execute(
        "INSERT INTO customer (id, email, plan, active) VALUES (42, 'c42@example.com', 'pro', 1)"
    )
    h.run(MONTH)
    return h.ledger(42, MONTH)


@pytest.mark.parametrize("status", [500, 502, 504, 408])
def test_credits_server_errors_retry(granting: Harness, api: HttpDouble, status: int) -> None:
    api.respond(status, times=2)
    # Called directly, process raises what raise_for_status raised ...
    with pytest.raises(httpx.HTTPStatusError, match=str(status)):
        granting.process(dict(CUSTOMER), MONTH)
    # ... which a run classifies: a retry.
    entry = one_customer_run(granting)
    assert entry is not None and entry.state == "retrying"
    assert f"HTTP {status} from" in (entry.reason or "")
    assert grants(granting) == []
    assert granting.counters == {}


@pytest.mark.parametrize("status", [400, 401, 404, 409, 422])
def test_credits_client_errors_fail(granting: Harness, api: HttpDouble, status: int) -> None:
    api.respond(status, times=1)
    entry = one_customer_run(granting)
    assert entry is not None and entry.state == "failed"
    assert f"HTTP {status} from" in (entry.reason or "")
    assert grants(granting) == []


def test_credits_wrong_path_fails(api: HttpDouble) -> None:
    v2 = {"BATCHRUN_BACKEND_CREDITS_URL": f"{api.url}/v2"}  # the API knows /grants
    with credits_harness(api, **v2) as h:
        entry = one_customer_run(h)
        assert entry is not None and entry.state == "failed"
        # The endpoint called, not the URL's other segments (urls.shown: they may hold a key).
        assert re.search(r"HTTP 404 from http://127\.0\.0\.1:\d+/…/grants$", entry.reason or "")
        assert api.requests_to("/grants") == []


def test_credits_timeout_retries(api: HttpDouble) -> None:
    api.respond(201, json=granted, delay_s=5.0, times=1)
    with credits_harness(api, BATCHRUN_BACKEND_CREDITS_TIMEOUT_S="0.2") as h:
        with pytest.raises(batchrun.Retry, match="ReadTimeout"):
            h.process(dict(CUSTOMER), MONTH)
        assert grants(h) == []


def test_credits_unreachable_api_retries(api: HttpDouble) -> None:
    port = free_port()
    unreachable = credits_harness(api, BATCHRUN_BACKEND_CREDITS_URL=f"http://127.0.0.1:{port}")
    with unreachable as h, pytest.raises(batchrun.Retry, match="ConnectError"):
        h.process(dict(CUSTOMER), MONTH)


def test_credits_success_without_a_grant_id_fails_rather_than_grant_twice(
    granting: Harness, api: HttpDouble
) -> None:
    api.respond(200, body="ok", times=1)
    api.respond(201, json={"grant": "g1"}, times=1)
    api.respond(201, json={"id": None}, times=1)
    api.respond(201, json=["g1"], times=1)
    for _ in range(4):
        with pytest.raises(batchrun.Fail, match="without a grant id"):
            granting.process(dict(CUSTOMER), MONTH)
    assert grants(granting) == []


def test_credits_unknown_plan_is_skipped_without_a_call(granting: Harness, api: HttpDouble) -> None:
    with pytest.raises(batchrun.Skip, match="plan 'legacy'"):
        granting.process({**CUSTOMER, "plan": "legacy"}, MONTH)
    assert api.requests == []


def test_credits_retried_until_done_grant_each_customer_once(
    granting: Harness, api: HttpDouble
) -> None:
    rows = [(i, f"c{i}@example.com", "starter", 1) for i in range(1, 21)]
    granting.execute("INSERT INTO customer (id, email, plan, active) VALUES :rows", rows=rows)
    api.respond(500, times=8)  # the first eight calls fail: those customers wait for a retry
    first = granting.run(MONTH)
    assert (first.succeeded, first.queued_for_retry) == (12, 8)
    rounds = 0
    while granting.status(MONTH)["retrying"] and rounds < 5:
        rounds += 1
        granting.retry()
    assert rounds == 1
    assert granting.status(MONTH)["succeeded"] == 20
    successes = Counter(r.headers["Idempotency-Key"] for r in api.requests[8:])
    assert successes == Counter({f"credits:2025-06:{i}": 1 for i in range(1, 21)})
    assert len(grants(granting)) == 20


def test_credits_runs_in_two_event_loops(api: HttpDouble) -> None:
    # A warm Lambda runs each invocation in a new loop: ctx.http's client belongs to the
    # run (closed at its end), so a run in another loop gets its own and works.
    rows = [(i, f"c{i}@example.com", "starter", 1) for i in (1, 2)]
    with credits_harness(api) as first, credits_harness(api) as second:
        for h in (first, second):
            h.execute("INSERT INTO customer (id, email, plan, active) VALUES :rows", rows=rows)
            assert h.run(MONTH).succeeded == 2
    assert len(api.requests) == 4


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
def test_credits_retry_after_header(
    granting: Harness, api: HttpDouble, header: str, delay: float | None
) -> None:
    api.respond(429, headers={"Retry-After": header}, times=1)
    api.respond(429, times=1)
    with pytest.raises(batchrun.Retry, match="429") as first:
        granting.process(dict(CUSTOMER), MONTH)
    assert first.value.delay_s == delay
    with pytest.raises(batchrun.Retry, match="429") as second:
        granting.process(dict(CUSTOMER), MONTH)
    assert second.value.delay_s is None


def test_examples_are_loaded_from_their_files() -> None:
    assert Path(renewal.__file__).parent.name == "renewal"
    assert renewal.RenewalReminder.sql is not None
    assert credits.MonthlyCredits.name == "credits"

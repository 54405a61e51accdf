"""The dashboard's pages and actions in-process (httpx over the ASGI app and a real
database): what each page shows, CSRF, read-only, the token, masked secrets, the bind
check. The real-browser tests are in test_ui_browser.py."""

from __future__ import annotations

import contextlib
import html
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from support.db import mysql_connect, query
from support.ui import client_of, csrf_of, make_app
from typer.testing import CliRunner

from batchrun.cli import app as cli_app
from batchrun.control.history import History
from batchrun.db import Store, connect
from batchrun.errors import PermanentMailError
from batchrun.jobs.birthday import Birthday, demo
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.period import parse
from batchrun.queue.base import from_url as queue_from_url
from batchrun.runtime import Runtime
from batchrun.settings import Settings
from batchrun.ui import notices
from batchrun.ui.security import (
    HEADERS,
    LOGIN_LIMIT,
    LOGIN_WINDOW_S,
    LoginLimiter,
    bind_error,
    is_loopback,
    token_warning,
)

JUNE = parse("month", "2025-06")
DEAD_ADDRESS = "dead@example.org"
ANY_HOST = ".".join(["0"] * 4)  # every interface


async def prepare(settings: Settings, *, fail_one: bool = True) -> dict[str, int]:
    """Migrate, seed, run June with one address refused for good (a dead letter)."""
    url = settings.db_url

    async def setup() -> None:
        database = await connect(url, create=True)
        try:
            store = Store(database)
            await store.migrate([Birthday()])
            await demo.seed_users(store.jobdb, 200, seed=2)
        finally:
            await database.close()

    async def run() -> int:
        database = await connect(url)
        mailer = FailFor(DEAD_ADDRESS, mailer_from_url(settings.mail_url))
        try:
            queue = queue_from_url(None, db=database, max_receives=settings.max_receives)
            runtime = Runtime(Birthday(), Store(database), mailer, queue, settings)
            return (await runtime.run(JUNE)).emails_sent
        finally:
            await mailer.close()
            await database.close()

    await setup()
    rows = query(
        url,
        "SELECT id FROM user WHERE birth_month = 6 AND status = 10 AND email IS NOT NULL "
        "ORDER BY id",
    )
    ids = [int(r[0]) for r in rows]
    if fail_one:
        query(url, "UPDATE user SET email = %s WHERE id = %s", DEAD_ADDRESS, ids[0])
    return {"first": ids[0], "second": ids[1], "sent": await run()}


class FailFor:
    """A mailer that refuses one recipient for good and passes the rest on."""

    def __init__(self, address: str, inner: Any) -> None:
        self.address, self.inner = address, inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, message: Any) -> None:
        if message.to_addr == self.address:
            raise PermanentMailError("550 5.1.1 no such user")
        await self.inner.send(message)


@pytest.fixture
def settings(db_url: str, make_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    return make_settings(db_url, mail_url=f"file://{tmp_path / 'outbox'}")


async def test_pages_show_jobs_periods_entities_queues_and_metrics(
    settings: Settings, db_url: str
) -> None:
    facts = await prepare(settings)
    async with client_of(make_app(settings)) as client:
        index = await client.get("/")
        assert index.status_code == 200
        assert "birthday" in index.text and "2025-06" in index.text
        assert f">{facts['sent']}<" in index.text  # the sent count
        job = await client.get("/jobs/birthday")
        assert job.status_code == 200 and "2025-06" in job.text
        entity = await client.get(f"/jobs/birthday/entities/{facts['second']}?period=2025-06")
        assert entity.status_code == 200
        assert f"&lt;birthday.2025.{facts['second']}@example.com&gt;" in entity.text
        found = await client.get(f"/jobs/birthday/entity?id={facts['second']}&period=2025-06")
        assert found.status_code == 303
        assert found.headers["location"].startswith(f"/jobs/birthday/entities/{facts['second']}")
        dead = await client.get("/dead")
        assert dead.status_code == 200 and "550 5.1.1 no such user" in dead.text
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert 'batchrun_entities{job="birthday",period="2025-06",state="failed"} 1.0' in (
            metrics.text
        )
        assert 'batchrun_queue_depth{queue="dead"} 1.0' in metrics.text
        live = (await client.get("/api/live")).json()
        assert live["birthday.sent"] == facts["sent"] and live["queue.dead"] == 1
        assert (await client.get("/jobs/nosuchjob")).status_code == 404
        for bad in ("/jobs/birthday?period=2025-13", "/api/live?job=birthday&period=June"):
            assert (await client.get(bad)).status_code == 400, bad
        assert (await client.get("/jobs/birthday/entities/1?period=x")).status_code == 400


async def test_redrive_needs_the_csrf_token_and_revives_the_entity(
    settings: Settings, db_url: str
) -> None:
    facts = await prepare(settings)
    async with client_of(make_app(settings)) as client:
        page = (await client.get("/dead")).text
        (message_id,) = [
            r[0] for r in query(db_url, "SELECT id FROM batchrun_queue WHERE dead = 1")
        ]
        refused = await client.post("/dead/redrive", data={"id": str(message_id)})
        assert refused.status_code == 403
        wrong = await client.post("/dead/redrive", data={"id": str(message_id), "csrf": "x" * 43})
        assert wrong.status_code == 403
        assert query(db_url, "SELECT dead FROM batchrun_queue WHERE id = %s", message_id) == [(1,)]
        done = await client.post(
            "/dead/redrive", data={"id": str(message_id), "csrf": csrf_of(page)}
        )
        assert done.status_code == 303 and "redriven" in done.headers["location"]
        assert query(db_url, "SELECT dead FROM batchrun_queue WHERE id = %s", message_id) == [(0,)]
        state = query(
            db_url,
            "SELECT state FROM batchrun_ledger WHERE job = 'birthday' AND entity_id = %s",
            facts["first"],
        )
        assert state == [(3,)]  # failed for good -> retrying: the consumer works it again


async def test_read_only_shows_no_actions_and_refuses_posts(
    sqlite_url: str, make_settings: Any
) -> None:
    settings = make_settings(sqlite_url)
    await prepare(settings)
    async with client_of(make_app(settings, read_only=True)) as client:
        for path in ("/", "/dead", "/jobs/birthday"):
            page = (await client.get(path)).text
            assert "<form" not in page.replace('<form method="get"', ""), path
            assert 'method="post"' not in page, path
        assert (await client.post("/dead/redrive", data={"id": "1"})).status_code == 403


async def test_a_token_guards_every_page(sqlite_url: str, make_settings: Any) -> None:
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    token = uuid.uuid4().hex
    async with client_of(make_app(settings, token=token)) as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/", headers={"accept": "text/html"})).headers[
            "location"
        ] == "/login"
        assert (
            await client.get("/", headers={"authorization": f"Bearer {token}"})
        ).status_code == 200
        assert (await client.get("/", headers={"authorization": "Bearer nope"})).status_code == 401
        assert (await client.post("/login", data={"token": "nope"})).status_code == 403
        signed = await client.post("/login", data={"token": token})
        assert signed.status_code == 303
        assert token not in signed.headers["set-cookie"]
        assert (await client.get("/")).status_code == 200  # the cookie now


async def test_odd_requests_get_a_4xx_and_a_big_login_body_is_not_read(
    sqlite_url: str, make_settings: Any
) -> None:
    """A forged cookie, ids no table can hold and a login body past the form's limit are
    each refused with a 4xx (they were 500s, and the body was read whole into memory);
    the login page shows nothing of the database; the live view's URL reaches the script
    whole (its period was lost after "&amp;" when the script held it as text)."""
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    token = uuid.uuid4().hex
    async with client_of(make_app(settings, token=token)) as client:
        forged = await client.get("/", headers={"cookie": "batchrun_ui=\u00e9".encode()})
        assert forged.status_code == 401
        login = await client.get("/login")
        assert login.status_code == 200 and "batchrun.db" not in login.text
        huge = b"token=" + b"0" * (2 * 1024 * 1024)
        assert (await client.post("/login", content=huge)).status_code == 403
        auth = {"authorization": f"Bearer {token}"}
        for path in (
            "/jobs/birthday/entity?id=%C2%B2",
            "/jobs/birthday/entity?id=" + "9" * 5000,
            "/jobs/birthday/entities/" + "9" * 30,
            "/runs/" + "9" * 30,
        ):
            answer = await client.get(path, headers=auth)
            assert answer.status_code in (400, 404), (path[:40], answer.status_code)
        page = await client.get("/jobs/birthday?period=2025-06", headers=auth)
        assert page.status_code == 200
        # an attribute, HTML-escaped: the script reads it back whole with getAttribute
        found = re.search(r'data-live-url="([^"]*)"', page.text)
        assert found is not None, page.text[:600]
        assert html.unescape(found[1]) == "/api/live?job=birthday&period=2025-06", found[1]


@pytest.mark.mysql
async def test_no_password_is_rendered(
    mysql_url: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    name = urlsplit(mysql_url).path.lstrip("/")
    user, password = f"ui_{uuid.uuid4().hex[:8]}", f"Pw{uuid.uuid4().hex[:12]}"
    conn = mysql_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'")
            cur.execute(f"GRANT ALL ON `{name}`.* TO '{user}'@'%'")
        url = f"mysql://{user}:{password}@127.0.0.1:3306/{name}"
        settings = make_settings(url, mail_url=f"file://{tmp_path / 'outbox'}")
        await prepare(settings)
        async with client_of(make_app(settings)) as client:
            for path in ("/", "/dead", "/jobs/birthday", "/metrics", "/api/live"):
                page = await client.get(path)
                assert page.status_code == 200, path
                assert password not in page.text, path
            assert f"{user}:***@" in (await client.get("/")).text
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        conn.close()


def test_bind_check() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback(ANY_HOST) and not is_loopback("192.0.2.1")
    assert bind_error("127.0.0.1", None) is None
    assert bind_error(ANY_HOST, "t0ken") is None
    assert "BATCHRUN_UI_TOKEN" in (bind_error(ANY_HOST, None) or "")


def test_ui_refuses_another_host_without_a_token(sqlite_url: str) -> None:
    env = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    result = CliRunner().invoke(
        cli_app, ["ui", "--host", ANY_HOST], env={**env, "BATCHRUN_DB": sqlite_url}
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "BATCHRUN_UI_TOKEN" in result.output


async def test_runs_and_steering_through_the_pages(settings: Settings, db_url: str) -> None:
    facts = await prepare(settings)
    database = await connect(settings.db_url)
    try:
        history = History(database, lease_s=settings.lease_s)
        run_id = await history.start(kind="run", job="birthday", period="2025-06")
        counts = {"eligible": 17, "succeeded": facts["sent"], "dead_lettered": 1}
        await history.end(run_id, exit_code=0, outcome="ok", counts=counts, error=None)
    finally:
        await database.close()
    async with client_of(make_app(settings)) as client:
        index = (await client.get("/")).text
        assert f'href="/runs/{run_id}"' in index and ">ok<" in index
        job = (await client.get("/jobs/birthday")).text
        assert f"#{run_id}" in job
        page = await client.get(f"/runs/{run_id}")
        assert page.status_code == 200
        assert "dead_lettered" in page.text and "550 5.1.1 no such user" in page.text
        assert f"/jobs/birthday/entities/{facts['first']}?period=2025-06" in page.text
        assert (await client.get("/runs/999999")).status_code == 404

        token = csrf_of(index)
        for action, paused in (("pause", 1), ("resume", 0)):
            done = await client.post(
                f"/jobs/birthday/{action}", data={"csrf": token, "period": "2025-06"}
            )
            assert done.status_code == 303, done.text
            rows = query(db_url, "SELECT paused FROM batchrun_control WHERE job = 'birthday'")
            assert rows == [(paused,)], action
            if paused:
                assert "Resume" in (await client.get("/")).text
        done = await client.post("/jobs/birthday/cancel", data={"csrf": token, "period": "2025-06"})
        assert done.status_code == 303
        rows = query(db_url, "SELECT cancelled_at FROM batchrun_control WHERE job = 'birthday'")
        assert rows[0][0] is not None
        assert (
            await client.post("/jobs/birthday/pause", data={"period": "2025-06"})
        ).status_code == 403
        bad = await client.post("/jobs/birthday/explode", data={"csrf": token})
        assert bad.status_code == 303 and "notice=unknown-action" in bad.headers["location"]


async def test_a_foreign_host_header_is_refused_without_a_token(
    sqlite_url: str, make_settings: Any
) -> None:
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    async with client_of(make_app(settings)) as client:
        assert (await client.get("/", headers={"host": "evil.example"})).status_code == 403
        assert (await client.get("/", headers={"host": "localhost:8765"})).status_code == 200
        assert (await client.get("/", headers={"host": "[::1]:8765"})).status_code == 200
        page = await client.get("/")
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


async def test_an_action_never_redirects_to_another_site(
    sqlite_url: str, make_settings: Any
) -> None:
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    async with client_of(make_app(settings)) as client:
        token = csrf_of((await client.get("/")).text)
        for referer in ("http://evil.example//evil.example/x", "//evil.example/", "javascript:x"):
            done = await client.post(
                "/jobs/birthday/resume", data={"csrf": token}, headers={"referer": referer}
            )
            assert done.status_code == 303
            assert done.headers["location"].startswith("/?notice="), referer
        done = await client.post(
            "/jobs/birthday/resume",
            data={"csrf": token},
            headers={"referer": "http://127.0.0.1/jobs/birthday?period=2025-06"},
        )
        assert done.headers["location"].startswith("/jobs/birthday?notice=")


@contextlib.asynccontextmanager
async def client_at(
    app: Starlette, base_url: str = "http://127.0.0.1", **transport: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """``client_of`` with its base URL (its scheme) and transport options (``client``: the
    address it comes from) chosen."""
    async with app.router.lifespan_context(app):
        asgi = httpx.ASGITransport(app=app, **transport)
        async with httpx.AsyncClient(transport=asgi, base_url=base_url) as client:
            yield client


def assert_secure_headers(response: httpx.Response) -> None:
    for name, value in HEADERS.items():
        assert response.headers.get(name) == value, (response.status_code, name)


async def test_every_response_carries_the_security_headers(
    sqlite_url: str, make_settings: Any
) -> None:
    """The gate's refusals and redirect, the framework's 404, 405 and 500 too (the headers
    were set on the pages only)."""
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    token = uuid.uuid4().hex
    auth = {"authorization": f"Bearer {token}"}
    async with client_at(make_app(settings, token=token), raise_app_exceptions=False) as client:
        answers = {
            401: await client.get("/metrics"),
            303: await client.get("/", headers={"accept": "text/html"}),
            403: await client.post("/login", data={"token": "nope"}),
            404: await client.get("/no/such/page", headers=auth),
            405: await client.get("/dead/redrive", headers=auth),
            200: await client.get("/", headers=auth),
        }
        query(sqlite_url, "DROP TABLE batchrun_run")
        answers[500] = await client.get("/", headers=auth)
        for status, answer in answers.items():
            assert answer.status_code == status, (status, answer.text[:200])
            assert_secure_headers(answer)
        no_csrf = await client.post("/jobs/birthday/pause", headers=auth)
        assert no_csrf.status_code == 403
        assert_secure_headers(no_csrf)
    async with client_of(make_app(settings, read_only=True)) as client:
        for refused in (
            await client.get("/", headers={"host": "evil.example"}),
            await client.post("/dead/redrive", data={"id": "1"}),
        ):
            assert refused.status_code == 403
            assert_secure_headers(refused)


async def test_no_inline_script_or_style_so_the_policy_allows_none(
    sqlite_url: str, make_settings: Any
) -> None:
    """The pages carried an inline <style> and <script> and the bars a style attribute, so
    the policy allowed 'unsafe-inline': an injected script would have run. They are files
    of the dashboard's own now, served to anyone (the login page needs its style sheet)."""
    settings = make_settings(sqlite_url)
    await prepare(settings)
    token = uuid.uuid4().hex
    auth = {"authorization": f"Bearer {token}"}
    policy = HEADERS["Content-Security-Policy"]
    assert "unsafe" not in policy and "script-src 'self'" in policy and "style-src 'self'" in policy
    async with client_of(make_app(settings, token=token)) as client:
        pages = ["/", "/jobs/birthday", "/dead", "/runs/1", "/jobs/birthday/entities/1"]
        for path in pages:
            page = await client.get(path, headers=auth)
            assert page.status_code in (200, 404), (path, page.status_code)
            html = page.text
            assert "<script>" not in html and "<style" not in html, path
            assert not re.search(r"\sstyle=|\son[a-z]+=", html), path
        index = (await client.get("/", headers=auth)).text
        assert '<progress class="bar' in index and 'data-live-url="/api/live"' in index
        login = await client.get("/login")
        assert '<link rel="stylesheet" href="/static/board.css">' in login.text
        for name, kind in (("board.css", "text/css"), ("live.js", "text/javascript")):
            served = await client.get(f"/static/{name}")  # no token: no data in them
            assert served.status_code == 200 and served.headers["content-type"].startswith(kind)
        assert "data-live-url" in (await client.get("/static/live.js")).text
        assert (await client.get("/static/../app.py", headers=auth)).status_code == 404
        assert (await client.get("/static/app.py", headers=auth)).status_code == 404


async def test_the_session_cookie_is_secure_over_https_only(
    sqlite_url: str, make_settings: Any
) -> None:
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    token = uuid.uuid4().hex
    app = make_app(settings, token=token)
    for base_url, secure in (("https://127.0.0.1", True), ("http://127.0.0.1", False)):
        async with client_at(app, base_url) as client:
            signed = await client.post("/login", data={"token": token})
            assert signed.status_code == 303
            flags = [f.strip().lower() for f in signed.headers["set-cookie"].split(";")]
            assert ("secure" in flags) is secure, (base_url, flags)
            assert "httponly" in flags and "samesite=strict" in flags


async def test_wrong_tokens_from_one_address_get_429_until_the_window_passes(
    sqlite_url: str, make_settings: Any
) -> None:
    """Past ``LOGIN_LIMIT`` wrong tokens (login form or Bearer) an address gets 429 with
    Retry-After, its token not looked at; a login that works is not counted; another
    address is not held back."""
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    token = uuid.uuid4().hex
    app = make_app(settings, token=token)
    async with client_at(app, client=("192.0.2.1", 4000)) as client:
        for _ in range(LOGIN_LIMIT - 1):
            assert (await client.post("/login", data={"token": "nope"})).status_code == 403
        assert (await client.post("/login", data={"token": token})).status_code == 303
        assert (await client.post("/login", data={"token": "nope"})).status_code == 403
        held = await client.post("/login", data={"token": token})
        assert held.status_code == 429, held.text
        assert 0 < int(held.headers["retry-after"]) <= LOGIN_WINDOW_S
        assert len(held.text) < 80 and token not in held.text
        assert_secure_headers(held)
        assert (await client.get("/")).status_code == 200  # its cookie still serves
    async with client_at(app, client=("192.0.2.2", 4000)) as client:
        assert (await client.post("/login", data={"token": "nope"})).status_code == 403
        for _ in range(LOGIN_LIMIT - 1):
            wrong = await client.get("/metrics", headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
        right = {"authorization": f"Bearer {token}"}
        held = await client.get("/metrics", headers=right)
        assert held.status_code == 429 and int(held.headers["retry-after"]) > 0
        assert (await client.post("/login", data={"token": token})).status_code == 429
    async with client_at(app, client=("192.0.2.3", 4000)) as client:
        assert (await client.get("/metrics", headers=right)).status_code == 200


def test_the_login_limiter_forgets_passed_windows_and_stays_bounded() -> None:
    now = [1000.0]
    limiter = LoginLimiter(3, 60.0, max_addresses=5, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.wait_s("a") == 0
        limiter.failed("a")
    assert limiter.wait_s("a") == 60
    now[0] += 59.5
    assert limiter.wait_s("a") == 1
    now[0] += 0.5
    assert limiter.wait_s("a") == 0 and len(limiter) == 0  # its window passed: forgotten
    for n in range(100):  # a flood of addresses, within one window
        now[0] += 0.01
        limiter.failed(f"flood-{n}")
    assert len(limiter) == 5  # the oldest made way
    for _ in range(3):
        limiter.failed("flood-99")
    assert limiter.wait_s("flood-99") > 0 and limiter.wait_s("flood-0") == 0
    now[0] += 61
    limiter.failed("b")
    assert len(limiter) == 1


def test_wrong_tokens_count_against_an_ipv6_clients_whole_64() -> None:
    """An IPv6 host holds a whole /64: a new address for each guess started a new count."""
    from starlette.requests import Request

    from batchrun.ui.security import client_address

    def of(host: str) -> str:
        return client_address(Request({"type": "http", "client": (host, 1234), "headers": []}))

    assert of("2001:db8:1:2::1") == of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert of("2001:db8:1:3::1") != of("2001:db8:1:2::1")
    assert of("203.0.113.7") == "203.0.113.7" and of("::ffff:203.0.113.7") == "::ffff:203.0.113.7"
    assert of("testclient") == "testclient"


async def test_a_notice_is_one_of_a_fixed_set(sqlite_url: str, make_settings: Any) -> None:
    """``?notice=`` names a fixed text, with values the dashboard could have given; any
    other text shows nothing (it was shown as given)."""
    settings = make_settings(sqlite_url)
    await prepare(settings, fail_one=False)
    async with client_of(make_app(settings, token=uuid.uuid4().hex)) as client:
        login = await client.get("/login", params={"notice": "Session expired: sign in at x.test"})
        assert login.status_code == 200
        assert "x.test" not in login.text and 'id="notice"' not in login.text
        named = await client.get("/login?notice=resumed&notice_job=birthday")
        assert 'id="notice"' not in named.text  # which jobs there are is not told
    paused = "birthday 2025-06 paused: running processes hold at their next heartbeat"
    async with client_of(make_app(settings)) as client:
        shown = {
            "notice=paused&notice_job=birthday&notice_period=2025-06": paused,
            "notice=redriven&notice_count=1": "1 dead letter redriven",
            "notice=redriven&notice_count=3": "3 dead letters redriven",
            "notice=resumed&notice_job=birthday": "birthday resumed",
        }
        for params, text in shown.items():
            page = await client.get(f"/?{params}")
            assert f'id="notice">{text}</p>' in page.text, params
        for params in (
            "notice=You+have+won",
            "notice=paused&notice_job=nosuchjob",
            "notice=paused&notice_job=birthday&notice_period=June",
            "notice=paused",  # the text takes a job
            "notice=redriven&notice_count=" + "9" * 40,
            "notice=task-period&notice_job=birthday&notice_action=explode",
        ):
            page = await client.get(f"/?{params}")
            assert 'id="notice"' not in page.text, params
        token = csrf_of((await client.get("/")).text)
        done = await client.post(
            "/jobs/birthday/pause",
            data={"csrf": token, "period": "2025-06"},
            headers={"referer": "http://127.0.0.1/jobs/birthday"},
        )
        assert done.status_code == 303
        assert paused in (await client.get(done.headers["location"])).text
    assert set(notices.NOTICES) >= {"paused", "resumed", "cancelled", "redriven"}


def test_a_short_token_is_warned_about_and_the_dashboard_still_starts(tmp_path: Path) -> None:
    """One warning line for a token under 16 characters, never the token; the start goes
    on (here to the database check, which fails: no server is left running)."""
    assert token_warning(None) is None and token_warning("x" * 16) is None
    assert "BATCHRUN_UI_TOKEN" in (token_warning("short") or "")
    env = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    env["BATCHRUN_DB"] = f"sqlite:///{tmp_path / 'missing.db'}"
    for token, warned in (("s3cr3t", True), (uuid.uuid4().hex, False)):
        result = CliRunner().invoke(
            cli_app, ["ui", "--port", "0"], env={**env, "BATCHRUN_UI_TOKEN": token}
        )
        assert result.exit_code == 1, result.output
        assert "batchrun db migrate" in result.output  # past the warning
        lines = [line for line in result.output.splitlines() if "warning" in line]
        assert len(lines) == (1 if warned else 0), result.output
        assert token not in result.output

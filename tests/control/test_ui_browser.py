"""The dashboard in a real browser (Debian's chromium through chromedriver): `batchrun ui` and
a birthday run as real processes over one SQLite file, a slow SMTP sink so the run lasts.

Without chromium the tests are skipped with one line saying what to install; under CI
(CI=true) a missing chromium fails them instead.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from support import IN_CI, ROOT
from support.browser import chromium_paths, start, wait_for
from support.cli import run_cli
from support.db import query
from support.smtp_server import SmtpTestServer, fail_recipients
from support.ui import serve

from batchrun.db import Store, connect
from batchrun.jobs.birthday import Birthday, demo

pytestmark = pytest.mark.slow
ANY_HOST = ".".join(["0"] * 4)  # every interface


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if chromium_paths() is None:
        message = "chromium and chromedriver not found: apt-get install chromium chromium-driver"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    driver = start()
    try:
        yield driver
    finally:
        driver.quit()


def live_number(driver: Any, key: str) -> int:
    text = driver.find_element(By.CSS_SELECTOR, f'[data-live="{key}"]').text
    return int(text.split("/")[0].strip() or 0)


async def migrate_and_seed(url: str, users: int) -> None:
    """`db migrate` and `db seed` in-process (two interpreters fewer to start)."""
    database = await connect(url, create=True)
    try:
        store = Store(database)
        await store.migrate([Birthday()])
        await demo.seed_users(store.jobdb, users, seed=3)
    finally:
        await database.close()


def live_text(driver: Any, key: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, f'[data-live="{key}"]').text)


def press(driver: Any, label: str) -> None:
    """Click the jobs page's button ``label`` and wait for the page it leads to."""
    button = driver.find_element(By.XPATH, f'//table[@id="jobs"]//button[text()="{label}"]')
    button.click()
    wait_for(lambda: driver.find_elements(By.ID, "notice"), what=f"the {label} notice")


def sent_in_db(url: str) -> int:
    return int(query(url, "SELECT COUNT(*) FROM batchrun_ledger WHERE state = 1")[0][0])


def steady(url: str) -> int | None:
    """The ledger's sent count, once two reads a second apart agree (in flight: done)."""
    before = sent_in_db(url)
    time.sleep(1.0)
    after = sent_in_db(url)
    return after if after == before and after > 0 else None


def bar_width(driver: Any, key: str) -> float:
    """How far the bar (a <progress>) shows, in percent."""
    value = driver.find_element(By.CSS_SELECTOR, f'[data-live="{key}"]').get_attribute("value")
    return float(value)


def test_watch_a_run_then_look_up_and_redrive(
    browser: Any, tmp_path: Path, smtp_server: SmtpTestServer
) -> None:
    env = {
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'batchrun.db'}",
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_LEASE_S": "3",  # a heartbeat a second: a pause is seen within one
    }
    asyncio.run(migrate_and_seed(env["BATCHRUN_DB"], 2000))
    june = query(
        env["BATCHRUN_DB"],
        "SELECT id, email FROM user WHERE birth_month = 6 AND status = 10 "
        "AND email IS NOT NULL ORDER BY id",
    )
    dead_id, dead_address = int(june[0][0]), str(june[0][1])
    smtp_server.set_policy(fail_recipients({dead_address: "550 5.1.1 No such user"}))
    smtp_server.set_latency(0.08)  # ~170 users at 2 at a time: several seconds of run

    with serve(env) as base:
        browser.get(base + "/")
        assert "birthday" in browser.find_element(By.ID, "jobs").text
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchrun",
                "birthday",
                *("--month", "2025-06", "--concurrency", "2"),
            ],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}, **env},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # The page's script refreshes the counts and the bar while the run goes on.
            first = wait_for(lambda: live_number(browser, "birthday.sent"), what="a first send")
            wider = bar_width(browser, "birthday.bar")
            wait_for(
                lambda: live_number(browser, "birthday.sent") > first + 5,
                what="the sent count to advance without a reload",
            )
            assert bar_width(browser, "birthday.bar") > wider
            assert run.poll() is None, "the run ended before the page saw it advance"

            # Pause: the run holds (in-flight sends finish), the page says so; resume.
            press(browser, "Pause")
            assert "paused" in browser.find_element(By.ID, "notice").text
            wait_for(
                lambda: "paused" in live_text(browser, "birthday.now"), what="the paused state"
            )
            held = wait_for(lambda: steady(env["BATCHRUN_DB"]), what="the sends to stop")
            wait_for(
                lambda: live_number(browser, "birthday.sent") == held, what="the page to show it"
            )
            for _ in range(3):  # three heartbeats of the run (BATCHRUN_LEASE_S=3: one a second)
                time.sleep(1.0)
                assert sent_in_db(env["BATCHRUN_DB"]) == held
            assert live_number(browser, "birthday.sent") == held
            assert run.poll() is None, "a paused run keeps its claims and waits"
            press(browser, "Resume")
            wait_for(
                lambda: live_number(browser, "birthday.sent") > held, what="sends after resume"
            )
        finally:
            _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        ((sent,),) = query(
            env["BATCHRUN_DB"], "SELECT COUNT(*) FROM batchrun_ledger WHERE state = 1"
        )
        wait_for(lambda: live_number(browser, "birthday.sent") == sent, what="the final count")

        # Look up an entity through the job page's form.
        browser.get(base + "/jobs/birthday")
        form = browser.find_element(By.ID, "lookup")
        form.find_element(By.NAME, "id").send_keys(str(june[1][0]))
        form.find_element(By.CSS_SELECTOR, "button").click()
        wait_for(lambda: browser.find_elements(By.ID, "story"), what="the story page")
        story = browser.find_element(By.ID, "story").text
        assert f"<birthday.2025.{june[1][0]}@example.com>" in story
        assert browser.find_element(By.ID, "state").text == "sent"

        # Redrive the dead letter from the queues page.
        browser.get(base + "/dead")
        row = browser.find_element(By.CSS_SELECTOR, "#dead tr[data-message]")
        assert "550 5.1.1" in row.text and str(dead_id) in row.text
        row.find_element(By.CSS_SELECTOR, "button").click()
        wait_for(lambda: browser.find_elements(By.ID, "notice"), what="the redrive notice")
        assert "1 dead letter redriven" in browser.find_element(By.ID, "notice").text
        assert not browser.find_elements(By.CSS_SELECTOR, "#dead tr[data-message]")
        assert str(dead_id) in browser.find_element(By.ID, "waiting").text
        state = query(
            env["BATCHRUN_DB"],
            "SELECT state FROM batchrun_ledger WHERE job = 'birthday' AND entity_id = %s",
            dead_id,
        )
        assert state == [(3,)]

        # A POST without the CSRF token, made from the page itself, is refused.
        status = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/dead/redrive', {method: 'POST', body: new URLSearchParams({id: '1'})})"
            ".then(r => done(r.status), e => done(String(e)));"
        )
        assert status == 403


def test_another_host_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {"BATCHRUN_DB": f"sqlite:///{tmp_path / 'batchrun.db'}"}
    done = run_cli("ui", "--host", ANY_HOST, "--port", "0", env=env, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "BATCHRUN_UI_TOKEN" in done.stderr

"""Debian's chromium, headless, driven through its chromedriver (Selenium): the browser the
dashboard's tests and ``make dashboard-picture`` use. No browser is downloaded."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
T = TypeVar("T")


def chromium_paths() -> tuple[str, str] | None:
    """(chromium, chromedriver), or None when either is missing."""
    browser = shutil.which("chromium") or (CHROMIUM if shutil.which(CHROMIUM) else None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def start(width: int = 1280, height: int = 800) -> webdriver.Chrome:
    """A headless chromium that only talks to loopback."""
    paths = chromium_paths()
    if paths is None:
        raise RuntimeError("chromium and chromium-driver are needed: apt-get install them")
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(paths[1]), options=options)


def wait_for(check: Callable[[], T | None], *, timeout: float = 20.0, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds.

    An element found on a page the browser was just replacing (a button's form posted,
    the page loading anew) is stale when read: that poll counts as not yet.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except StaleElementReferenceException:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.1)

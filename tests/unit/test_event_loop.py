"""The event loop a command runs on: uvloop when installed, asyncio's when asked or not."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import uvloop  # noqa: F401  # the dev extra installs it; the tests need it
from support.cli import run_cli

from batchrun.errors import ConfigError
from batchrun.runtime import event_loop
from batchrun.settings import Settings


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_and_uvloop_run_on_uvloop_when_it_is_installed() -> None:
    assert event_loop.run(_loop_module()).startswith("uvloop")
    assert event_loop.run(_loop_module(), "uvloop").startswith("uvloop")
    assert event_loop.run(_loop_module(), "asyncio").startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert event_loop.run(_loop_module()).startswith("asyncio")
    with pytest.raises(ConfigError, match=r"pip install 'batchrun\[uvloop\]'"):
        event_loop.loop_factory("uvloop")


def test_the_setting_takes_three_values() -> None:
    assert Settings.from_env({}).event_loop == "auto"
    assert Settings.from_env({"BATCHRUN_EVENT_LOOP": " AsyncIO "}).event_loop == "asyncio"
    with pytest.raises(ConfigError, match="BATCHRUN_EVENT_LOOP must be auto, asyncio or uvloop"):
        Settings.from_env({"BATCHRUN_EVENT_LOOP": "tokio"})


def test_a_command_says_its_loop_with_vv_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'loop.db'}"]
    for choice, shown in (("", "uvloop"), ("asyncio", "asyncio")):
        done = run_cli("-vv", *db, "db", "migrate", env={"BATCHRUN_EVENT_LOOP": choice})
        assert done.returncode == 0, done.stderr
        assert f"event loop: {shown}" in done.stderr
    done = run_cli(*db, "db", "migrate", env={"BATCHRUN_EVENT_LOOP": "tokio"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: BATCHRUN_EVENT_LOOP must be auto, asyncio or uvloop, got 'tokio'"
    ]

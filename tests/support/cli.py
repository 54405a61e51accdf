"""``python -m batchrun`` in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from batchrun.cli import app
from support import ROOT

SENDER = "birthday@example.com"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_cli(
    *args: str,
    env: dict[str, str],
    timeout: float = 60,
    check: bool = False,
    sigterm_after: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batchrun`` in a subprocess with ``env`` added to a clean environment.

    ``sigterm_after``: send SIGTERM after that many seconds (a worker runs until then).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    if sigterm_after is not None:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchrun", *args],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            out, err = process.communicate(timeout=sigterm_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return subprocess.run(
        [sys.executable, "-m", "batchrun", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        cwd=ROOT,
    )


def cli_env(db_url: str, mail_url: str, **extra: str) -> dict[str, str]:
    """The environment of a batchrun subprocess: short leases so reruns wait little."""
    return {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": mail_url,
        "BATCHRUN_FROM": SENDER,
        "BATCHRUN_LEASE_S": "1",
        "BATCHRUN_RETRY_BASE_S": "0",
        "COLUMNS": "400",  # rich wraps log lines at the terminal width; keep one per line
        **extra,
    }


def spawn(
    *args: str, env: dict[str, str], stdout: Any = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """Start ``python -m batchrun ARGS`` without waiting (to kill it, or to act meanwhile)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")} | env
    return subprocess.Popen(
        [sys.executable, "-m", "batchrun", *args],
        env=full,
        cwd=ROOT,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(done: Callable[[], bool], *, timeout: float, step: float = 0.005) -> bool:
    """Poll ``done`` until it holds or ``timeout`` passes; return whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(step)
    return done()


def summary_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON object a ``--json`` command printed on stdout."""
    assert result.stdout.strip(), f"no JSON summary (exit {result.returncode}): {result.stderr}"
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def cli_seed_users(db_url: str, env: dict[str, str], users: int, seed: int) -> None:
    """`db migrate` then `db seed` of ``users`` demo users, through the CLI."""
    migrate = run_cli("db", "migrate", env=env)
    assert migrate.returncode == 0, migrate.stderr
    seeded = run_cli("db", "seed", "--users", str(users), "--seed", str(seed), env=env)
    assert seeded.returncode == 0, seeded.stderr


# -- in-process, through typer's CliRunner ------------------------------------------------


def invoke(*args: str, env: dict[str, str]) -> Result:
    """Run the CLI in-process with ``env`` on top of the environment minus BATCHRUN_*."""
    full: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    full.update({"COLUMNS": "200", "TERMINAL_WIDTH": "200", "NO_COLOR": "1"})
    full.update(env)
    return CliRunner().invoke(app, list(args), env=full)


def text(result: Result) -> str:
    return ANSI.sub("", result.output)


def assert_clean_failure(result: Result, code: int) -> str:
    """Exit ``code`` through the CLI's own handling: no escaped exception, no traceback."""
    out = text(result)
    assert result.exit_code == code, out
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception),
        out,
    )
    assert "Traceback" not in out
    return out


def migrate_and_seed(env: dict[str, str], users: int = 600, seed: int = 3) -> None:
    result = invoke("db", "migrate", env=env)
    assert result.exit_code == 0, text(result)
    result = invoke("db", "seed", "--users", str(users), "--seed", str(seed), env=env)
    assert result.exit_code == 0, text(result)

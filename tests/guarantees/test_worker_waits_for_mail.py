"""`batchrun worker` started while the mail server is down waits for it:
backoff up to 30 s, one log line per change, and it serves once the server is back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from support import ROOT
from support.birthday import eligible_ids, migrate_and_seed_demo
from support.cli import run_cli
from support.ports import free_port
from support.smtp_server import SmtpTestServer


def wait_for(done: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_worker_waits_for_the_mail_server_then_serves(sqlite_url: str, tmp_path: object) -> None:
    migrate_and_seed_demo(sqlite_url, 300)
    uid = min(eligible_ids(sqlite_url, 6))
    port = free_port()
    env = {
        "BATCHRUN_DB": sqlite_url,
        "BATCHRUN_MAIL": f"smtp://127.0.0.1:{port}",
        "BATCHRUN_FROM": "batchrun@example.com",
    }
    queued = run_cli("submit", "birthday", "--period", "2025-06", "--id", str(uid), env=env)
    assert queued.returncode == 0, queued.stderr
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    stderr_path = tmp_path / "stderr.txt"  # type: ignore[operator]
    with open(stderr_path, "w") as err:
        worker = subprocess.Popen(
            [sys.executable, "-m", "batchrun", "worker", "--idle-exit", "1", "--json"],
            env=full,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
        )
        server = SmtpTestServer()
        try:
            assert wait_for(lambda: "waiting for it" in stderr_path.read_text(), 30)
            time.sleep(1.5)  # a few more checks fail: still one line, still running
            assert worker.poll() is None, "the worker waits instead of exiting"
            server.start(port)
            out, _ = worker.communicate(timeout=90)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            sent = server.sends_per_user()
            server.stop()
    logged = stderr_path.read_text()
    assert worker.returncode == 0, logged
    assert json.loads(out)["succeeded"] == 1
    assert sent[uid] == 1
    lines = [line for line in logged.splitlines() if line.strip()]
    assert len([x for x in lines if "waiting for it" in x]) == 1, logged
    assert len([x for x in lines if "pass again" in x]) == 1, logged
    assert f"cannot connect to smtp://127.0.0.1:{port}" in logged

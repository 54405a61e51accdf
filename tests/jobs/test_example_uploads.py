"""examples/uploads (seed 000): a web app's request submits three tasks per upload; two
workers run every user's in order, one at a time, each once."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

from support import ROOT
from support.cli import run_cli
from support.db import query

import batchrun

EXAMPLE = ROOT / "examples" / "uploads"
sys.path.insert(0, str(EXAMPLE))

from app import make_app  # noqa: E402


def post(app: Any, query_string: str) -> tuple[str, dict[str, Any]]:
    said: list[str] = []
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/uploads",
        "QUERY_STRING": query_string,
        "wsgi.input": io.BytesIO(),
    }
    body = b"".join(app(environ, lambda status, headers: said.append(status)))
    return said[0], json.loads(body) if said[0].startswith("202") else {}


def test_uploads_run_in_order_per_user_each_once(db_url: str) -> None:
    env = {
        "BATCHRUN_DB": db_url,
        "BATCHRUN_JOBS": str(EXAMPLE / "uploads.py"),
        "BATCHRUN_MAIL": "console://",
    }
    migrated = run_cli("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    with batchrun.connect(db=db_url, jobs=env["BATCHRUN_JOBS"], env={}) as client:
        app = make_app(client)
        for user in range(1, 21):
            status, body = post(app, f"user_id={user}&upload_id={100 + user}")
            assert status.startswith("202") and len(body["tasks"]) == 3
        status, _ = post(app, "user_id=1&upload_id=101")  # the browser sent it twice
        assert status.startswith("202")
        assert post(app, "user_id=x")[0].startswith("400")
    full = {**{k: v for k, v in __import__("os").environ.items() if "BATCHRUN" not in k}, **env}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "batchrun", "worker", "--idle-exit", "2"],
            env=full,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
    rows = query(db_url, "SELECT user_id, kind FROM upload_step ORDER BY id")
    assert len(rows) == 60  # 20 users x 3 tasks, the repeated request adding none
    for user in range(1, 21):
        assert [kind for uid, kind in rows if uid == user] == ["scan", "thumbnail", "publish"]
    counts = json.loads(run_cli("status", "uploads", "--json", env=env).stdout)
    assert (counts["succeeded"], counts["dead"], counts["pending"]) == (60, 0, 0)

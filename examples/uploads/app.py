"""A small web app (standard-library WSGI) whose POST /uploads submits the three tasks.

    BATCHRUN_DB=... BATCHRUN_JOBS=examples/uploads/uploads.py python examples/uploads/app.py

    curl -X POST 'localhost:8000/uploads?user_id=7&upload_id=42'

``batchrun.connect()`` reads BATCHRUN_DB / BATCHRUN_RETRY_QUEUE / BATCHRUN_JOBS; its
``submit`` is synchronous, so a plain (Flask, Django) view calls it as it is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import make_server

sys.path.insert(0, str(Path(__file__).parent))

from uploads import submit_upload

import batchrun


def make_app(client: Any) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] != "POST" or environ["PATH_INFO"] != "/uploads":
            start("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        args = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            user_id, upload_id = int(args["user_id"][0]), int(args["upload_id"][0])
        except (KeyError, ValueError):
            start("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"user_id and upload_id are integers\n"]
        keys = submit_upload(client, user_id, upload_id)
        start("202 Accepted", [("Content-Type", "application/json")])
        return [json.dumps({"tasks": keys}).encode()]

    return app


if __name__ == "__main__":
    with batchrun.connect() as client, make_server("127.0.0.1", 8000, make_app(client)) as http:
        http.serve_forever()

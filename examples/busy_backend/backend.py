"""Seed 001's backend: it processes one task at a time and says whether it is busy.

    python examples/busy_backend/backend.py --port 8081 --task-s 5

- ``GET /api/worker-status`` answers ``{"status": "busy"}`` or ``{"status": "idle"}``.
- ``POST /api/process-task`` with a JSON body (``{"s3_url": "s3://bucket/key"}``) takes
  the task when idle: it answers ``202 {"status": "accepted"}`` at once and works on it
  for ``task_s`` seconds, busy meanwhile (a file download and its processing take
  minutes: no client holds a request that long, so the status endpoint is how it learns
  when the backend is free). Sent while busy it answers ``503 {"error": "server busy"}``
  and records the request: the one thing its clients must never do. A task whose
  ``Idempotency-Key`` it already took gets ``200 {"status": "duplicate"}`` and no work.
- ``GET /api/stats``: every task's interval, the requests it got while busy, and how
  many status answers said busy and idle.

It is the standard library only; tests start it on 127.0.0.1 on a free port
(``BusyBackend(task_s=0.2).start()``) and read ``tasks`` and ``busy_requests`` directly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


@dataclass(frozen=True)
class TaskRun:
    """One task the backend worked on: its key, what it was given, when (epoch seconds)."""

    key: str
    body: Any
    started: float
    ended: float


@dataclass(frozen=True)
class BusyRequest:
    """A work request that arrived while a task was running (answered 503)."""

    key: str
    body: Any
    at: float


class BusyBackend:
    """The backend, on ``host`` and a free port (or ``port``).

    Args:
        task_s: how long each task keeps it busy.
    """

    def __init__(self, task_s: float = 0.2, host: str = "127.0.0.1", port: int = 0) -> None:
        self.task_s = task_s
        self.tasks: list[TaskRun] = []
        self.busy_requests: list[BusyRequest] = []
        self.status_answers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._running: tuple[str, Any, float] | None = None  # the task now: key, body, start
        self._keys: set[str] = set()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._running is not None

    def status(self) -> str:
        with self._lock:
            answer = "busy" if self._running is not None else "idle"
            self.status_answers[answer] += 1
        return answer

    def take(self, key: str, body: Any) -> int:
        """Take a task if idle: 202; 503 (recorded) if busy; 200 for a key taken before."""
        now = time.time()
        with self._lock:
            if key and key in self._keys:
                return 200
            if self._running is not None:
                self.busy_requests.append(BusyRequest(key, body, now))
                return 503
            self._running = (key, body, now)
            if key:
                self._keys.add(key)
        threading.Thread(target=self._work, daemon=True).start()
        return 202

    def _work(self) -> None:
        self._closing.wait(self.task_s)
        with self._lock:
            assert self._running is not None
            key, body, started = self._running
            self.tasks.append(TaskRun(key, body, started, time.time()))
            self._running = None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "tasks": [asdict(t) for t in self.tasks],
                "busy_requests": [asdict(r) for r in self.busy_requests],
                "status_answers": dict(self.status_answers),
            }

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _handler(backend: BusyBackend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/api/worker-status":
                self._send(200, {"status": backend.status()})
            elif self.path == "/api/stats":
                self._send(200, backend.stats())
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path != "/api/process-task":
                self._send(404, {"error": "not found"})
                return
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                self._send(400, {"error": "body is not JSON"})
                return
            status = backend.take(self.headers.get("Idempotency-Key", ""), body)
            answer = {
                202: {"status": "accepted"},
                200: {"status": "duplicate"},
                503: {"error": "server busy"},
            }[status]
            self._send(status, answer)

        def _send(self, status: int, answer: Any) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A backend that takes one task at a time.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--task-s", type=float, default=5.0, help="seconds each task keeps it busy")
    options = parser.parse_args()
    with BusyBackend(options.task_s, options.host, options.port) as served:
        print(f"serving on {served.url}, {options.task_s:g} s per task; Ctrl-C stops", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()

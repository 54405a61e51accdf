"""A local HTTP double for the backends a job calls: real HTTP on a loopback port.

It records every request and answers what the test told it to, so a job's own HTTP
client (httpx, ``ctx.http``) runs unchanged against it::

    with HttpDouble() as api:
        api.respond(201, json={"id": "g1"}, method="POST", path="/grants")
        api.respond(429, headers={"Retry-After": "7"}, times=1)  # first, once
        ...  # run the job with CREDITS_API_URL=api.url
        (call,) = api.requests
        assert call.headers["Idempotency-Key"] == "credits:2025-06:42"

Answers with ``times`` are used first, in the order given, each for that many matching
requests; then the latest answer without ``times`` that matches; a request nothing
matches gets ``404``. It serves from its own threads, so it works from sync and async
tests alike.
"""

from __future__ import annotations

import json as jsonlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from batchrun.testing.mailbox import Headers


@dataclass(frozen=True)
class Request:
    """One request the double received.

    Attributes:
        method: ``"GET"``, ``"POST"`` ...
        path: the path without the query (``"/grants"``).
        query: the query's parameters (the last value of each).
        headers: the request's header fields, case-insensitive.
        body: the raw body.
    """

    method: str
    path: str
    query: dict[str, str]
    headers: Headers = field(repr=False)
    body: bytes = field(repr=False)

    @property
    def json(self) -> Any:
        """The body parsed as JSON (ValueError when it is not)."""
        return jsonlib.loads(self.body)


# What to answer: the same JSON every time, or one computed from the request.
JsonAnswer = Any | Callable[[Request], Any]


@dataclass
class _Answer:
    status: int
    json: JsonAnswer
    body: bytes
    headers: dict[str, str]
    method: str | None
    path: str | None
    times: int | None
    delay_s: float

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or self.path == path
        )


_NO_JSON = object()


class HttpDouble:
    """A local HTTP server standing in for a job's backend.

    Args:
        host: the loopback address to listen on; the port is a free one (``url``).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.requests: list[Request] = []
        self._answers: list[_Answer] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer((host, 0), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:PORT`` (no trailing slash)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def env(self, backend: str) -> dict[str, str]:
        """``{"BATCHRUN_BACKEND_<NAME>_URL": url}``: the variable a job's backend ``backend``
        takes its base URL from, for the harness's ``env``."""
        return {f"BATCHRUN_BACKEND_{backend.upper().replace('-', '_')}_URL": self.url}

    def respond(
        self,
        status: int = 200,
        *,
        json: JsonAnswer = _NO_JSON,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        method: str | None = None,
        path: str | None = None,
        times: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Answer matching requests with ``status``.

        Args:
            status: the HTTP status.
            json: a JSON body, or a function of the ``Request`` returning one (a fresh
                id per call); sets ``Content-Type: application/json``.
            body: a raw body instead of ``json``.
            headers: more response header fields (``{"Retry-After": "7"}``).
            method: only requests with this method (default: any).
            path: only requests to this path, without the query (default: any).
            times: for the next ``times`` matching requests only (default: from now on).
            delay_s: wait this long before answering (a slow backend; a client timeout).
        """
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1, got {times}")
        raw = body.encode() if isinstance(body, str) else body
        answer = _Answer(
            status, json, raw, dict(headers or {}), method and method.upper(), path, times, delay_s
        )
        with self._lock:
            self._answers.append(answer)

    def reset(self) -> None:
        """Forget the requests and every answer given."""
        with self._lock:
            self.requests.clear()
            self._answers.clear()

    def requests_to(self, path: str, method: str | None = None) -> list[Request]:
        """The requests to ``path`` (with ``method``, if given)."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.path == path and (method is None or r.method == method.upper())
            ]

    def _answer(self, request: Request) -> _Answer | None:
        with self._lock:
            self.requests.append(request)
            for answer in self._answers:
                if answer.times and answer.matches(request.method, request.path):
                    answer.times -= 1
                    return answer
            for answer in reversed(self._answers):
                if answer.times is None and answer.matches(request.method, request.path):
                    return answer
        return None

    def start(self) -> Self:
        """Start serving (``with HttpDouble() as api`` does it)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port; delayed answers are cut short."""
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


def _handler(double: HttpDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            parts = urlsplit(self.path)
            request = Request(
                method=self.command,
                path=parts.path,
                query=dict(parse_qsl(parts.query)),
                headers=Headers(self.headers.items()),
                body=self.rfile.read(length) if length else b"",
            )
            answer = double._answer(request)
            if answer is None:
                status, body, headers = 404, b"no answer set for this request", {}
                content_type = "text/plain"
            else:
                if answer.delay_s and double._closing.wait(answer.delay_s):
                    return  # closing: the client sees the connection drop
                status, headers = answer.status, answer.headers
                content_type = "application/octet-stream"
                body = answer.body
                if answer.json is not _NO_JSON:
                    value = answer.json(request) if callable(answer.json) else answer.json
                    body, content_type = jsonlib.dumps(value).encode(), "application/json"
            self.send_response(status)
            if "content-type" not in {k.lower() for k in headers}:
                self.send_header("Content-Type", content_type)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads ``requests``, not stderr

    return Handler


__all__ = ["HttpDouble", "JsonAnswer", "Request"]

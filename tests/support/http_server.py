"""A real HTTP grants API for tests: the stdlib's ThreadingHTTPServer on a free loopback port.

``POST /grants`` (a JSON body) grants a credit and answers ``201 {"id": "g1"}``. It is
deliberately not idempotent: a second call with the same ``Idempotency-Key`` grants again
with a fresh id, so a test can count duplicates. Failures and delays are set from the
test's thread at any time::

    with GrantsTestServer() as server:               # start() ... stop()
        server.answer_next(2, 429, retry_after=7)    # the next two calls: 429, Retry-After: 7
        server.answer_fraction(0.3, 500, seed=1)     # then about 30% of calls: 500
        server.delay(1.0, n=1)                       # the next call waits 1 s before answering
        ...
        assert server.grants_per_key() == Counter({"credits:2025-06:42": 1})
        server.reset()                               # counters, answers and delays cleared

Import it as ``from support.http_server import GrantsTestServer`` (pytest puts ``tests/`` on
``sys.path``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Answer:
    """A failure to answer with instead of a grant."""

    status: int
    retry_after: str | None = None


@dataclass(frozen=True)
class Call:
    """One POST /grants the server received, and what it answered."""

    key: str | None
    body: Any
    status: int
    grant_id: str | None
    at: float = 0.0  # time.monotonic() when it arrived (before any delay)


class _State:
    """Shared by the handler threads and the test's thread, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Event()  # set to cut every pending delay short
        self.clear()

    def clear(self) -> None:
        self.calls: list[Call] = []
        self.next_answers: deque[Answer] = deque()
        self.fraction: tuple[float, Answer, random.Random] | None = None
        self.delay_s = 0.0
        self.delays_left: int | None = None  # None: every call
        self.grants = 0

    def plan(self) -> tuple[Answer | None, float]:
        """The answer (None: grant) and the delay for the call arriving now."""
        with self.lock:
            delay = 0.0
            if self.delay_s > 0 and self.delays_left != 0:
                delay = self.delay_s
                if self.delays_left is not None:
                    self.delays_left -= 1
            if self.next_answers:
                return self.next_answers.popleft(), delay
            if self.fraction is not None:
                share, answer, rng = self.fraction
                if rng.random() < share:
                    return answer, delay
            return None, delay

    def record(self, key: str | None, body: Any, answer: Answer | None, at: float) -> Call:
        with self.lock:
            grant_id = None
            if answer is None:
                self.grants += 1
                grant_id = f"g{self.grants}"
            call = Call(key, body, answer.status if answer else 201, grant_id, at)
            self.calls.append(call)
            return call


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real API and httpx's pool expect
    # TCP_NODELAY: headers and body go out as two writes; with Nagle on, the body waits for
    # the client's delayed ACK of the headers, ~40 ms per call (as a real API's would not).
    disable_nagle_algorithm = True
    timeout = 10  # an idle kept-alive connection ends its thread after this
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/grants":
            self._reply(404, {"error": "not found"})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._reply(400, {"error": "body is not JSON"})
            return
        state = self.server.state
        arrived = time.monotonic()
        answer, delay = state.plan()
        if delay:
            state.wake.wait(delay)
        call = state.record(self.headers.get("Idempotency-Key"), body, answer, arrived)
        if answer is None:
            self._reply(201, {"id": call.grant_id})
            return
        headers = {"Retry-After": answer.retry_after} if answer.retry_after is not None else {}
        self._reply(answer.status, {"error": HTTPStatus(answer.status).phrase}, headers)

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read the counters, not a log


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: _State) -> None:
        super().__init__((HOST, 0), _Handler)
        self.state = state

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and closed its connection is what the delay tests make.
        pass


class GrantsTestServer:
    """The grants API on a free port of 127.0.0.1, served from its own thread."""

    def __init__(self) -> None:
        self._state = _State()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._server is None:
            raise RuntimeError("server not started")
        return f"http://{HOST}:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._server = _Server(self._state)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._state.wake.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Clear counters, planned answers and delays; release calls still delayed."""
        state = self._state
        with state.lock:
            state.wake.set()
            state.wake = threading.Event()
            state.clear()

    def answer_next(self, n: int, status: int, *, retry_after: float | str | None = None) -> None:
        """Answer the next ``n`` calls with ``status`` (and ``Retry-After`` if given)."""
        answer = Answer(status, None if retry_after is None else str(retry_after))
        with self._state.lock:
            self._state.next_answers.extend([answer] * n)

    def answer_fraction(
        self,
        fraction: float,
        status: int,
        *,
        retry_after: float | str | None = None,
        seed: int = 0,
    ) -> None:
        """Answer about ``fraction`` of the calls (after any ``answer_next``) with ``status``;
        ``fraction=0`` stops it. Seeded, so a test sees the same sequence every run."""
        answer = Answer(status, None if retry_after is None else str(retry_after))
        with self._state.lock:
            self._state.fraction = (fraction, answer, random.Random(seed)) if fraction else None

    def delay(self, seconds: float, n: int | None = None) -> None:
        """Wait ``seconds`` before answering each of the next ``n`` calls (None: every call)."""
        with self._state.lock:
            self._state.delay_s = seconds
            self._state.delays_left = n

    def calls(self) -> list[Call]:
        """Every call received so far, in order of answer."""
        with self._state.lock:
            return list(self._state.calls)

    def calls_per_key(self) -> Counter[str | None]:
        """How many times each Idempotency-Key was called, whatever the answer."""
        return Counter(call.key for call in self.calls())

    def calls_per_second(self) -> list[int]:
        """Calls that arrived in each whole second from the first one (buckets of 1 s)."""
        calls = self.calls()
        if not calls:
            return []
        first = min(c.at for c in calls)
        buckets = Counter(int(c.at - first) for c in calls)
        return [buckets.get(i, 0) for i in range(max(buckets) + 1)]

    def grants_per_key(self) -> Counter[str | None]:
        """How many credits each Idempotency-Key was granted: above 1 is a duplicate."""
        return Counter(call.key for call in self.calls() if call.grant_id is not None)

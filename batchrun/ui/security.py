"""Who may see the dashboard and act on it: the bind check, the token and its limit of
wrong ones, the CSRF token, the headers of every response.

- Loopback (127.0.0.0/8, ::1, localhost) needs nothing; any other address needs
  ``BATCHRUN_UI_TOKEN``, or the dashboard refuses to start (``bind_error``); a token
  shorter than ``MIN_TOKEN`` is warned about (``token_warning``) and still served.
- With a token set, every request carries it: ``Authorization: Bearer TOKEN``, or the
  cookie the login form sets (an HMAC of the token, never the token itself; ``Secure``
  when the login came over https).
- Without a token, a request must name a loopback Host (no DNS rebinding).
- Every POST carries the process's CSRF token in its form (``csrf``): a page of another
  origin cannot read it, so it cannot make a browser post for it.
- A client address that gave a wrong token ``LOGIN_LIMIT`` times within ``LOGIN_WINDOW_S``
  (login form or Bearer) gets 429 for any token it gives until that window has passed.
- Every response, the refusals included, carries ``HEADERS`` (``SecureHeaders``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
from collections.abc import Callable
from time import monotonic

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "batchrun_ui"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
MIN_TOKEN = 16
LOGIN_LIMIT = 10  # wrong tokens from one address ...
LOGIN_WINDOW_S = 60.0  # ... within this many seconds of its first: 429 until they pass
LOGIN_ADDRESSES = 4096  # the most addresses remembered at once
# No framing (clickjacking), nothing loaded from elsewhere, nothing inline: the style sheet
# and the script are the dashboard's own files (/static/), so an injected <script> or
# style attribute does not run even where escaping were to miss one.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_error(host: str, token: str | None) -> str | None:
    """Why the dashboard must not listen on ``host``, or None when it may."""
    if is_loopback(host) or token:
        return None
    return (
        f"--host {host} is reachable from other machines: set BATCHRUN_UI_TOKEN "
        "(sent as Authorization: Bearer, or through the login form) or bind to 127.0.0.1"
    )


def token_warning(token: str | None) -> str | None:
    """A line to warn with when ``token`` is short enough to guess, or None (never the
    token, nor its length)."""
    if token is None or len(token) >= MIN_TOKEN:
        return None
    return (
        f"BATCHRUN_UI_TOKEN is shorter than {MIN_TOKEN} characters, easy to guess: use a "
        "long random one, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    )


class LoginLimiter:
    """Wrong tokens counted per client address, in a window that opens at the first.

    At most ``max_addresses`` are remembered: those whose window has passed are forgotten
    first, then the oldest, so a flood of addresses cannot grow the table.
    """

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        max_addresses: int = LOGIN_ADDRESSES,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.limit, self.window_s, self.max_addresses = limit, window_s, max_addresses
        self._clock = clock
        # address -> (window start, failures), in order of window start (only a new
        # window is inserted; the clock never goes back): the passed ones come first
        self._failures: dict[str, tuple[float, int]] = {}

    def __len__(self) -> int:
        return len(self._failures)

    def wait_s(self, address: str) -> int:
        """Whole seconds until ``address`` may give a token again (0: now)."""
        now = self._clock()
        self._forget_passed(now)
        start, failures = self._failures.get(address, (now, 0))
        if failures < self.limit:
            return 0
        return max(1, math.ceil(start + self.window_s - now))

    def failed(self, address: str) -> None:
        """Count a wrong token from ``address``."""
        now = self._clock()
        self._forget_passed(now)
        known = self._failures.get(address)
        if known is not None:  # in its window still: counted in place, its order kept
            self._failures[address] = (known[0], known[1] + 1)
            return
        while len(self._failures) >= self.max_addresses:
            del self._failures[next(iter(self._failures))]
        self._failures[address] = (now, 1)

    def _forget_passed(self, now: float) -> None:
        while self._failures:
            address, (start, _) = next(iter(self._failures.items()))
            if start + self.window_s > now:
                return
            del self._failures[address]


def too_many(wait_s: int) -> Response:
    return PlainTextResponse(
        f"too many wrong tokens: try again in {wait_s} s",
        status_code=429,
        headers={"Retry-After": str(wait_s)},
    )


def client_address(request: Request) -> str:
    """Who the wrong tokens are counted against: the client's address (uvicorn's proxy
    headers make it the client's behind a proxy it trusts), an IPv6 one's /64, which one
    host holds whole (a new address a guess would not start a new count)."""
    host = request.client.host if request.client is not None else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6 and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return host


class SecureHeaders:
    """``HEADERS`` on every HTTP response of the app it wraps: pages, the gate's refusals,
    the framework's own 404, 405, 413 and 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Guard:
    """The token check, the wrong tokens' limit and the CSRF token of one dashboard
    process."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self._key = secrets.token_bytes(32)
        self.csrf = secrets.token_urlsafe(32)
        self.logins = LoginLimiter(LOGIN_LIMIT, LOGIN_WINDOW_S)

    def session_value(self) -> str:
        """The login cookie's value: proof of the token, not the token."""
        assert self.token is not None
        return hmac.new(self._key, self.token.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    @staticmethod
    def bearer(request: Request) -> str | None:
        """The token the request gives in ``Authorization: Bearer``, or None."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return given.strip() if scheme.lower() == "bearer" else None

    def allowed(self, request: Request) -> bool:
        """Whether the request may see the dashboard (always, without a token); a wrong
        Bearer token counts against the client's address."""
        if self.token is None:
            return True
        cookie = request.cookies.get(COOKIE, "")
        # As bytes: compare_digest refuses a str that is not ASCII (a forged cookie).
        if cookie and hmac.compare_digest(cookie.encode(), self.session_value().encode()):
            return True
        given = self.bearer(request)
        if given is None:
            return False
        if self.token_matches(given):
            return True
        self.logins.failed(client_address(request))
        return False

    def host_ok(self, host: str) -> bool:
        """Without a token, only a loopback Host: a page of another site whose name is made
        to resolve to 127.0.0.1 (DNS rebinding) is not served."""
        if self.token is not None:
            return True
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.startswith("[") and "]" in name:
            name = name[1 : name.index("]")]
        return is_loopback(name)

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())

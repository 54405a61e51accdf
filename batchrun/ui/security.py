"""Who may see the dashboard and act on it: the bind check, the token, the CSRF token.

- Loopback (127.0.0.0/8, ::1, localhost) needs nothing; any other address needs
  ``BATCHRUN_UI_TOKEN``, or the dashboard refuses to start (``bind_error``).
- With a token set, every request carries it: ``Authorization: Bearer TOKEN``, or the
  cookie the login form sets (an HMAC of the token, never the token itself).
- Without a token, a request must name a loopback Host (no DNS rebinding).
- Every POST carries the process's CSRF token in its form (``csrf``): a page of another
  origin cannot read it, so it cannot make a browser post for it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets

from starlette.requests import Request

COOKIE = "batchrun_ui"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


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


class Guard:
    """The token check and the CSRF token of one dashboard process."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        self._key = secrets.token_bytes(32)
        self.csrf = secrets.token_urlsafe(32)

    def session_value(self) -> str:
        """The login cookie's value: proof of the token, not the token."""
        assert self.token is not None
        return hmac.new(self._key, self.token.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def allowed(self, request: Request) -> bool:
        """Whether the request may see the dashboard (always, without a token)."""
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(given.strip()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        # As bytes: compare_digest refuses a str that is not ASCII (a forged cookie).
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self.session_value().encode())

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

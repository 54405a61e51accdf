"""One-click unsubscribe (RFC 8058): signed tokens, what applying one does, the HTTP answer.

With ``BATCHRUN_UNSUBSCRIBE_URL`` and ``BATCHRUN_UNSUBSCRIBE_SECRET`` set, every email
carries ``List-Unsubscribe: <BASE/TOKEN>`` and ``List-Unsubscribe-Post:
List-Unsubscribe=One-Click``. A TOKEN names the job and the address and is signed with
HMAC-SHA256 under the secret:

    PAYLOAD = base64url("job:address")
    TOKEN = PAYLOAD "." base64url(HMAC-SHA256(secret, "batchrun-unsubscribe-v1." PAYLOAD))

(unpadded base64url, so the token is URL-safe as it stands). The MAC covers the encoded
payload text, so any change to the token's characters, a truncation, or a token signed with
another secret fails the constant-time comparison before anything is decoded. Applying a
token puts the address on the suppression list in its one key (``address_key``: IDNA
domain, case-folded; reason ``unsubscribe``, source the job):
every job skips it from then on.

A mailbox provider POSTs to the URL (one click, no login, no cookies); a person who follows
the link in the email gets a page with a confirm button (a form POSTing to the same URL),
because link scanners and prefetchers GET every link in a message and must not unsubscribe
anyone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from html import escape

from batchrun.db.store import Store
from batchrun.errors import ConfigError, InvalidTokenError
from batchrun.settings import MIN_SECRET_CHARS, Settings

ONE_CLICK = ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click")
MAX_TOKEN_CHARS = 1024
# The MAC is for this use only, whatever else the secret may sign; v1 names the format.
_DOMAIN = b"batchrun-unsubscribe-v1."
_MAC_CHARS = 43  # 32 bytes of base64url, unpadded
_TOKEN = re.compile(rf"([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{{{_MAC_CHARS}}})")


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    """What a verified token asks: stop mailing ``address`` (it came from ``job``'s email)."""

    job: str
    address: str


class Signer:
    """Makes and verifies the tokens of one secret, and the URLs under one base.

    Args:
        secret: ``BATCHRUN_UNSUBSCRIBE_SECRET``; every token signed with it stays valid
            until it changes.
        base_url: ``BATCHRUN_UNSUBSCRIBE_URL``; a URL is ``base_url/TOKEN``. None for a
            signer that only verifies (``batchrun unsubscribe``).
    """

    def __init__(self, secret: str, base_url: str | None = None) -> None:
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"BATCHRUN_UNSUBSCRIBE_SECRET must be at least {MIN_SECRET_CHARS} characters"
            )
        # The keyed inner and outer hash states, computed once: each token copies them.
        self._mac = hmac.new(secret.encode("utf-8"), _DOMAIN, hashlib.sha256)
        self.base_url = base_url.rstrip("/") if base_url is not None else None

    @classmethod
    def from_settings(cls, settings: Settings) -> Signer | None:
        """The signer ``settings`` configure, or None when unsubscribe is not configured."""
        if settings.unsubscribe_secret is None:
            return None
        return cls(settings.unsubscribe_secret, settings.unsubscribe_url)

    def token(self, job: str, address: str) -> str:
        """The token naming ``job`` and ``address``."""
        payload = base64.urlsafe_b64encode(f"{job}:{address}".encode()).rstrip(b"=")
        return (payload + b"." + self.mac(payload)).decode("ascii")

    def url(self, job: str, address: str) -> str:
        """``base_url/TOKEN``: what List-Unsubscribe names and templates get as unsubscribe_url."""
        if self.base_url is None:
            raise ConfigError("BATCHRUN_UNSUBSCRIBE_URL is not set")
        return f"{self.base_url}/{self.token(job, address)}"

    def verify(self, token: str) -> UnsubscribeRequest:
        """The request a genuine token makes; InvalidTokenError for any other text."""
        match = _TOKEN.fullmatch(token) if len(token) <= MAX_TOKEN_CHARS else None
        if match is None:
            raise InvalidTokenError()
        payload = match.group(1).encode("ascii")
        if not hmac.compare_digest(self.mac(payload), match.group(2).encode("ascii")):
            raise InvalidTokenError()
        try:
            text = base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):  # signed here, so never in practice
            raise InvalidTokenError() from None
        job, sep, address = text.partition(":")
        if not sep or not job or not address:
            raise InvalidTokenError()
        return UnsubscribeRequest(job, address)

    def mac(self, payload: bytes) -> bytes:
        """The token's second part for ``payload`` (its first): unpadded URL-safe base64."""
        mac = self._mac.copy()
        mac.update(payload)
        return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=")


def headers(url: str) -> tuple[tuple[str, str], ...]:
    """``List-Unsubscribe`` and ``List-Unsubscribe-Post`` for a message whose URL is ``url``."""
    return (("List-Unsubscribe", f"<{url}>"), ONE_CLICK)


def token_of(text: str) -> str:
    """The token in ``text``: a bare token, or the whole URL from an email (its last segment)."""
    text = text.strip()
    if "/" in text:
        text = text.split("?", 1)[0].split("#", 1)[0].rstrip("/").rpartition("/")[2]
    return text


async def apply(store: Store, request: UnsubscribeRequest) -> bool:
    """Suppress the request's address (reason ``unsubscribe``, source the job); whether it
    was not suppressed before. Applying a token twice changes nothing."""
    return await store.suppress(request.address, reason="unsubscribe", source=request.job)


# -- the HTTP answer (the Lambda's Function URL or API Gateway route) ----------------------


@dataclass(frozen=True, slots=True)
class Response:
    """An HTTP response: status, HTML body and headers."""

    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


# No script, no outside resource, no framing; the form may post back to this URL only; the
# token in the URL is never sent on as a Referer; nothing is cached or indexed.
HTTP_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Robots-Tag": "noindex",
}


async def respond(
    method: str,
    path: str,
    signer: Signer,
    suppress: Callable[[UnsubscribeRequest], Awaitable[bool]],
) -> Response:
    """Answer ``method`` on ``path`` (``.../TOKEN``): POST suppresses the token's address
    (200), GET shows a confirm button; a bad token gets 400 and a page that names nobody.

    Args:
        suppress: applies a verified request (``apply`` on the store); called for POST
            only, so a GET never needs the database.
    """
    method = method.upper()
    if method not in ("GET", "POST"):
        return _page(405, "Not allowed", "<p>Use the link in the email.</p>", Allow="GET, POST")
    try:
        request = signer.verify(token_of(path))
    except InvalidTokenError:
        return _page(
            400,
            "This link is not valid",
            "<p>This unsubscribe link is not valid. Use the link in the email exactly as it "
            "came, or reply to the email to ask to be removed.</p>",
        )
    if method == "GET":
        return _page(
            200,
            "Unsubscribe",
            f"<p>Stop emails to <strong>{escape(request.address)}</strong>?</p>"
            '<form method="post">'
            '<input type="hidden" name="List-Unsubscribe" value="One-Click">'
            '<button type="submit" style="font-size:16px; padding:10px 20px;">'
            "Unsubscribe</button></form>",
        )
    await suppress(request)
    return _page(
        200,
        "Unsubscribed",
        f"<p>{escape(request.address)} will get no more of these emails.</p>",
    )


def unavailable() -> Response:
    """The answer when the suppression could not be recorded (the database is down)."""
    return _page(
        503,
        "Please try again",
        "<p>Your request could not be recorded just now. Please try again in a few minutes.</p>",
        **{"Retry-After": "60"},
    )


def _page(status: int, title: str, content: str, **headers: str) -> Response:
    body = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title></head>"
        '<body style="font-family:Arial, Helvetica, sans-serif; max-width:480px; '
        'margin:48px auto; padding:0 16px; color:#1f2937;">'
        f'<h1 style="font-size:22px;">{escape(title)}</h1>{content}</body></html>\n'
    )
    return Response(status, body, {**HTTP_HEADERS, **headers})

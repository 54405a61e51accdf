"""The end-of-run webhook: ``BATCHRUN_NOTIFY_URL`` gets a Slack-compatible JSON POST.

``BATCHRUN_NOTIFY_ON=failure`` (the default) posts when a run ends with exit 1, 3 or 130,
or when the dead-letter queue grew during the run; ``always`` posts at every end. The
body is ``{"text", "job", "period", "outcome", "exit_code", "counts", "run_id", "host"}``
(Slack shows ``text``; other receivers read the fields).

Delivery never changes the exit code and never blocks the run's end more than
``TIMEOUT_S``: a failure (refused, timed out, an HTTP error) is one log line, with the
URL's secret parts (a Slack hook's path is its credential) left out. The standard
library's HTTP client in a thread: no runtime dependency for one POST.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from batchrun.errors import ConfigError
from batchrun.urls import origin

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
FAILURE_EXITS = frozenset({1, 3, 130})
NotifyOn = Literal["failure", "always"]


where = origin  # the URL as a log line may show it: scheme, host and port only


class Notifier:
    """Posts a run's end to a webhook, if it is one to tell."""

    def __init__(self, url: str, *, on: NotifyOn = "failure", timeout_s: float = TIMEOUT_S) -> None:
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ConfigError(f"BATCHRUN_NOTIFY_URL must be an http(s):// URL, got {where(url)}")
        try:
            urlsplit(url).port  # noqa: B018 (a port that is not a number raises here)
        except ValueError:
            raise ConfigError(
                f"BATCHRUN_NOTIFY_URL has a port that is not one: {where(url)}"
            ) from None
        self.url = url
        self.on = on
        self.timeout_s = timeout_s
        # urllib takes no user and password in a URL (it looked their "user:pw@host" up
        # as a host name): they go as HTTP Basic, the URL without them.
        self._target, self._authorization = _basic_auth(url)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Notifier | None:
        """The notifier ``BATCHRUN_NOTIFY_URL`` / ``BATCHRUN_NOTIFY_ON`` describe (None:
        no URL).

        Raises:
            ConfigError: a URL that is not http(s), or an unknown ``BATCHRUN_NOTIFY_ON``.
        """
        url = environ.get("BATCHRUN_NOTIFY_URL", "").strip()
        if not url:
            return None
        on = environ.get("BATCHRUN_NOTIFY_ON", "").strip().lower() or "failure"
        if on not in ("failure", "always"):
            raise ConfigError(f"BATCHRUN_NOTIFY_ON must be failure or always, got {on[:20]!r}")
        return cls(url, on="always" if on == "always" else "failure")

    def wanted(self, exit_code: int, *, dead_letters_grew: bool) -> bool:
        return self.on == "always" or exit_code in FAILURE_EXITS or dead_letters_grew

    async def send(self, payload: dict[str, Any]) -> bool:
        """POST ``payload``; whether the receiver answered 2xx. Never raises."""
        body = json.dumps(payload, default=str).encode()
        try:
            await asyncio.wait_for(asyncio.to_thread(self._post, body), self.timeout_s + 0.5)
        except Exception as exc:
            log.warning("run notification to %s not delivered: %s", where(self.url), _why(exc))
            return False
        return True

    def _post(self, body: bytes) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "batchrun"}
        request = urllib.request.Request(  # noqa: S310 (http(s) only, checked in __init__)
            self._target, data=body, method="POST", headers=headers
        )
        if self._authorization is not None:
            # Not passed on to where a redirect points: another host, or plain http.
            request.add_unredirected_header("Authorization", self._authorization)
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            response.read(1024)


def _basic_auth(url: str) -> tuple[str, str | None]:
    """``url`` without its user and password, and the Authorization header they make
    (None without them)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    token = base64.b64encode(pair.encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=netloc)), f"Basic {token}"


def _why(exc: BaseException) -> str:
    """Why a post failed, without the URL's path or query (where a token may be)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {TIMEOUT_S:g} s"
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    if isinstance(exc, http.client.InvalidURL | ValueError):
        # Their text quotes the URL (http.client's: its path and query, escaped).
        return f"{type(exc).__name__}: BATCHRUN_NOTIFY_URL is not a usable URL"
    return type(exc).__name__


def payload(
    *,
    job: str | None,
    period: str | None,
    kind: str,
    outcome: str,
    exit_code: int,
    counts: dict[str, Any] | None,
    run_id: int | None,
    host: str,
    error: str | None = None,
) -> dict[str, Any]:
    """The webhook's JSON body: ``text`` for Slack, and the run's fields."""
    what = " ".join(x for x in (job or kind, period) if x)
    text = f"batchrun {what}: {outcome} (exit {exit_code})"
    if run_id is not None:
        text += f", run {run_id}"
    text += f" on {host}"
    if error:
        text += f": {error}"
    return {
        "text": text,
        "job": job,
        "period": period,
        "kind": kind,
        "outcome": outcome,
        "exit_code": exit_code,
        "counts": counts,
        "run_id": run_id,
        "host": host,
    }

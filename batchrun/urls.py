"""URL helpers: masking secrets before anything is printed or logged."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from batchrun.errors import ConfigError

# The password runs to the LAST '@' of the URL (as urlsplit and the drivers read it), so a
# raw '@' inside a password is masked too; masking too much is the safe way to be wrong.
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>\S*)@")
_MIN_SECRET = 4  # shorter "passwords" would garble every message they appear in


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url)


def mask_text(text: str, *urls: str | None) -> str:
    """Remove every password that appears in ``urls`` from ``text``; never raises, even
    for a URL ``urlsplit`` cannot read (an unclosed ``[``)."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, mask_url(url))
        try:
            password = urlsplit(url).password
        except ValueError:
            found = _USERINFO.match(url)
            password = found["pw"] if found else None
        if password and len(password) >= _MIN_SECRET:
            text = text.replace(password, "***")
    return text


def origin(url: str) -> str:
    """``url``'s scheme, host and port, as any line may show it (``?`` for a port that is
    not a number); no user, password, path, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    head = f"{parts.scheme}://" + (f"[{host}]" if ":" in host else host)
    try:
        port = parts.port
    except ValueError:
        return head + ":?"
    return head + (f":{port}" if port else "")


# The last path segment a failure reason may show: a name, as endpoints have ("charges",
# "sendMessage", "Messages.json", "v2"), short, without digits but a version's, and with
# few capitals. A webhook's secret is often exactly that segment (Slack's 24 random
# characters, Discord's 68): one that is not such a name shows as "…".
_ENDPOINT_NAME = re.compile(r"[A-Za-z][A-Za-z._-]{0,19}[0-9]{0,2}")


def shown(url: str) -> str:
    """``url`` as a log line or a stored failure reason may show it: its ``origin`` and
    the last segment of its path when it is a plain name (the endpoint a job called). No
    user, password, other path segments, query or fragment: any of them may hold a key."""
    try:
        urlsplit(url).port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:  # that, or not a URL urlsplit reads (an unclosed '['): nothing shown
        return f"{scheme_of(url) or '?'}://?"
    head = origin(url)
    segments = [s for s in urlsplit(url).path.split("/") if s]
    if not segments:
        return head
    last = segments[-1]
    if not _ENDPOINT_NAME.fullmatch(last) or sum(map(str.isupper, last)) > 3:
        return head + "/…"
    return head + ("/" if len(segments) == 1 else "/…/") + last


def split(url: str) -> SplitResult:
    """``urlsplit`` of a setting's URL; odd ports are checked where used.

    Raises:
        ConfigError: a URL urlsplit cannot read (an unclosed ``[`` of an IPv6 host): one
            line, the password masked.
    """
    try:
        return urlsplit(url)
    except ValueError as exc:
        # Its scheme and host part only, the password masked: a path or query may hold a
        # key (a backend's URL), as ``shown`` has it.
        head, sep, rest = mask_url(url).partition("://")
        where = head + sep + rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
        raise ConfigError(f"unusable URL {where!r}: {exc}") from None


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url``, or '' when it has none."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep else ""


__all__ = ["mask_text", "mask_url", "origin", "scheme_of", "shown", "split"]

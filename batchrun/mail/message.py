"""The Message every backend sends: its wire bytes built by hand, names and subjects encoded
(RFC 2047), every header folded to RFC 5322's line limits (78 where a space allows, never
over 998), addresses checked."""

from __future__ import annotations

import email
import email.policy
import functools
import random
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, parseaddr

from batchrun.mail.address import idna_domain, wire_address
from batchrun.mail.headers import (
    _FOLD,
    _MAX_LINE,
    _header_text,
    encoded_words,
    fold,
)
from batchrun.mail.mime import body_part, text_body

MAX_NAME_CHARS = 200
MAX_ADDRESS_CHARS = 254

# Characters that could end a header line or smuggle one in: C0/C1 controls (CR, LF, NUL,
# NEL ...), lone surrogates (unencodable), and the Unicode line/paragraph separators; that
# is exactly the Unicode categories Cc, Cs, Zl and Zp (a test checks every code point).
# One compiled class: these checks run on every name and address of every message.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")
# Whitespace (as str.isspace sees it) and the RFC 5322 specials and quoting characters:
# legal only inside quoted local parts, which no real recipient list needs, and each one
# could change how a header or envelope is parsed.
_ADDRESS_FORBIDDEN = re.compile(r'[\s()<>\[\]:;,\\"\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]')


def clean_text(value: str, limit: int | None = None) -> str:
    """Return ``value`` with every control or line-break character replaced by a space.

    Args:
        value: a display name or subject, possibly hostile.
        limit: cap on the result's length in characters, if any.
    """
    cleaned = _UNSAFE.sub(" ", value)
    if limit is not None:
        cleaned = cleaned[:limit]
    return cleaned.strip()


@functools.lru_cache(maxsize=4096)  # each address is checked by prepare, process and send
def valid_address(addr: str) -> bool:
    """Return whether ``addr`` passes a plain syntax check for a deliverable address.

    One ``@``, a non-empty local part, a domain with a dot (or ``localhost``), no
    whitespace, control or RFC 5322 special characters, at most 254 characters.
    Non-ASCII is allowed: the domain must then have an IDNA form (``bücher.example`` is
    sent as ``xn--bcher-kva.example``; ``🎂.example`` has none), and a non-ASCII local
    part needs a server that offers SMTPUTF8, which the mailer checks at send.
    """
    if not addr or len(addr) > MAX_ADDRESS_CHARS or addr.count("@") != 1:
        return False
    if _ADDRESS_FORBIDDEN.search(addr):
        return False
    local, domain = addr.split("@")
    if not local or not domain:
        return False
    if not addr.isascii():
        # A non-ASCII local part is deliverable where SMTPUTF8 is (the mailer decides);
        # a domain must have an IDNA form, and the checks below apply to that form.
        wire = idna_domain(domain)
        if wire is None or len(local.encode("utf-8")) + 1 + len(wire) > MAX_ADDRESS_CHARS:
            return False
        domain = wire
    if domain.lower() == "localhost":
        return True
    labels = domain.split(".")
    return len(labels) >= 2 and all(labels)


def sender_problem(sender: str) -> str | None:
    """What makes ``sender`` (``Name <addr>`` or ``addr``) unusable as a From, if anything."""
    if any(ord(c) < 32 or ord(c) == 127 for c in sender):
        return "contains a control character"
    address = parseaddr(sender)[1] or sender
    if not valid_address(address):
        return "is not a usable sender address"
    if not address.isascii():
        return "is not ASCII (the sender address must be)"
    return None


@dataclass(frozen=True, slots=True)
class Message:
    """One email to one recipient; every backend sends ``to_bytes()``."""

    sender: str
    to_addr: str
    to_name: str
    subject: str
    text: str
    html: str  # "" for a text-only message
    message_id: str  # stable per (job, year, user), e.g. "<birthday.2025.42@example.com>"
    # More header fields, as (name, value): ASCII, one line each (List-Unsubscribe ...).
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def envelope_sender(self) -> str:
        """The bare address of ``sender`` (which may be ``Name <addr>``), for MAIL FROM."""
        return _envelope_sender(self.sender)

    @property
    def envelope_to(self) -> str:
        """``to_addr`` as RCPT TO and the To header carry it: the domain in IDNA.

        Raises ValueError (``AddressError``) when the domain has no IDNA form."""
        return wire_address(self.to_addr)

    @property
    def display_to(self) -> str:
        """The To header value: the cleaned display name and the address."""
        return formataddr((clean_text(self.to_name, MAX_NAME_CHARS), self.to_addr))

    def to_bytes(self, *, utf8: bool = False) -> bytes:
        """The message as sent: RFC 5322 bytes, text and HTML alternatives in UTF-8.

        The recipient's domain is written in IDNA. A non-ASCII local part can only be
        written as UTF-8 in the To header (RFC 6532), for a server that takes SMTPUTF8:
        ``utf8=True`` allows it, otherwise it is a ValueError like any unsendable address.

        Built directly rather than through ``email.message`` (which costs ~2 ms a message
        and would make the CPU, not the mail server, the limit); ``to_email`` parses it
        back, and the tests check the two agree. Raises ValueError when an address, the
        Message-ID or an extra header holds a line break or control character (or an extra
        header is not plain ASCII or is too long for one line): they are never silently
        rewritten, so the caller must reject them. Names and subject are free text and are
        cleaned instead, so they can never add a header.
        """
        for value in (self.sender, self.to_addr, self.message_id):
            if _unsafe(value):
                raise ValueError(f"header value contains a line break: {value!r}")
        to_addr = wire_address(self.to_addr)
        to_name = clean_text(self.to_name, MAX_NAME_CHARS)
        if to_addr.isascii():
            to_header = address_header(to_name, to_addr)
        elif utf8:
            to_header = _utf8_address(to_name, to_addr)
        else:
            raise ValueError(f"the local part of {self.to_addr!r} is not ASCII: it needs SMTPUTF8")
        if len(to_header) > _MAX_LINE - 4:  # a long plain name: folded between its words
            to_header = _fold_address(to_header, len("To: "))
        extra = "".join([_extra_header(n, v) for n, v in self.headers]) if self.headers else ""
        # No quoted-printable part can contain the boundary ('=' is escaped there); a 7bit
        # one only by a 96-bit accident. Random only by convention, so the cheap generator
        # does (a urandom call per message showed in profiles).
        boundary = f"=_batchrun_{random.getrandbits(96):024x}"
        headers = (
            f"From: {_from_header(self.sender)}"
            f"\r\nTo: {to_header}"
            f"\r\nSubject: {_subject_header(self.subject)}"
            f"\r\nDate: {_now_header()}"
            f"\r\nMessage-ID: {self.message_id}"
            # SES replaces Message-ID with its own; this copy survives, so a downstream
            # system can still drop the one duplicate a crash may cause (invariant 3).
            f"\r\nX-Batchrun-Id: {self.message_id}"
            # RFC 3834: no auto-reply (vacation, out-of-office) should answer this message.
            "\r\nAuto-Submitted: auto-generated"
            f"{extra}"
            "\r\nMIME-Version: 1.0"
        )
        # ASCII but for a UTF-8 To header, which only utf8=True lets through.
        charset = "utf-8" if utf8 else "ascii"
        if not self.html:  # a text-only message: one part, no multipart wrapper
            encoding, body = text_body(self.text)
            return (
                headers + '\r\nContent-Type: text/plain; charset="utf-8"'
                f"\r\nContent-Transfer-Encoding: {encoding}\r\n\r\n"
            ).encode(charset) + body
        # Folded: on one line it is 83 characters, over RFC 5322's 78.
        headers += f'\r\nContent-Type: multipart/alternative;\r\n boundary="{boundary}"\r\n\r\n'
        return b"".join(
            (
                headers.encode(charset),
                body_part(boundary, "plain", self.text),
                body_part(boundary, "html", self.html),
                f"--{boundary}--\r\n".encode("ascii"),
            )
        )

    def to_email(self, *, utf8: bool = False) -> EmailMessage:
        """``to_bytes`` parsed back into an EmailMessage (for tests and inspection)."""
        raw = self.to_bytes(utf8=utf8)
        # The email package reads 8-bit header bytes as escapes: decode UTF-8 headers first.
        parsed = (
            email.message_from_string(raw.decode("utf-8"), policy=email.policy.SMTPUTF8)
            if utf8
            else email.message_from_bytes(raw, policy=email.policy.SMTP)
        )
        assert isinstance(parsed, EmailMessage)
        return parsed


def _unsafe(value: str) -> bool:
    return _UNSAFE.search(value) is not None


# RFC 5322 field names: printable ASCII but the colon.
_FIELD_NAME = re.compile(r"[!-9;-~]+")
# Fields to_bytes writes itself, and the ones that would name more recipients: an extra
# field may not repeat or add them.
_OWN_FIELDS = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "subject",
        "date",
        "message-id",
        "x-batchrun-id",
        "auto-submitted",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
    }
)


def _extra_header(name: str, value: str) -> str:
    """``CRLF name: value`` folded, or ValueError for a field that could break the header
    block (or has a word too long for any line)."""
    folded = (
        fold(value, len(name) + 2)
        if _field_name(name) and _UNSAFE.search(value) is None and value.isascii()
        else None
    )
    if folded is None:
        raise ValueError(f"unusable header field {name!r}: {value[:80]!r}")
    return f"\r\n{name}: {folded}"


@functools.lru_cache(maxsize=64)
def _field_name(name: str) -> bool:
    # A message's extra fields are the same few names every time: checked once each.
    return _FIELD_NAME.fullmatch(name) is not None and name.lower() not in _OWN_FIELDS


# Every message of a run has the same sender: parse it once, not twice per message.
@functools.lru_cache(maxsize=16)
def _envelope_sender(sender: str) -> str:
    return parseaddr(sender)[1] or sender


@functools.lru_cache(maxsize=16)
def _from_header(sender: str) -> str:
    value = address_header(*parseaddr(sender)) if "<" in sender else sender
    return _fold_address(value, len("From: "))


def _fold_address(value: str, prefix: int) -> str:
    """An address header value folded at its spaces when it is too long for one line (an
    encoded name comes folded already); an address alone never has a space to fold at."""
    if prefix + len(value) <= _MAX_LINE or "\r\n" in value:
        return value
    return fold(value, prefix) or value


def address_header(name: str, addr: str, prefix: int = len("From: ")) -> str:
    """``Name <addr>``, the name RFC 2047-encoded when it is not plain ASCII.

    ``prefix`` is how many characters (the header's name) precede the value on its first
    line: a line holding an encoded word stays within 78 characters.
    """
    if addr.isascii():  # what formataddr gives, without its per-byte work
        if name.isascii() and "=?" not in name:
            if not _NAME_SPECIALS.search(name):
                return f"{name} <{addr}>" if name else addr
        else:
            # A name that is itself an encoded word would be decoded by the reader (CR/LF
            # included): it is encoded once more, so the reader sees exactly this text.
            encoded = encoded_words(name, _MAX_LINE - prefix)
            fold = encoded.rfind("\n")
            last_line = len(encoded) - fold - 1 if fold >= 0 else prefix + len(encoded)
            if last_line + len(addr) + 3 <= _MAX_LINE:
                return f"{encoded} <{addr}>"  # formataddr's bytes, when it is one word
            return f"{encoded}{_FOLD}<{addr}>"
    # Only a quoted ASCII name is left, which holds no encoded word: formataddr adds the
    # quotes. It also raises UnicodeEncodeError (a ValueError) for a non-ASCII address.
    return formataddr((name, addr), charset="utf-8")


def _utf8_address(name: str, addr: str) -> str:
    """``Name <addr>`` for an address with a non-ASCII local part (RFC 6532): the name
    written exactly as for an ASCII address, the address in UTF-8 as it is."""
    shown = address_header(name, "@")  # "@": an ASCII stand-in, replaced below
    return f"{shown[:-2]}{addr}>" if shown.endswith("<@>") else addr


# email.utils' specialsre: a name holding any of these is quoted by formataddr.
_NAME_SPECIALS = re.compile(r'[][\\()<>@,:;".]')


@functools.lru_cache(maxsize=16)
def _subject_header(subject: str) -> str:
    """The Subject header value; a job's messages share one subject, so it is cached."""
    return _header_text(clean_text(subject), len("Subject: "))


_date_cache: tuple[int, str] = (0, "")


def _now_header() -> str:
    """The Date header value, formatted once a second (every message in it shares it)."""
    global _date_cache
    second = int(time.time())
    if _date_cache[0] != second:
        _date_cache = (second, format_datetime(datetime.fromtimestamp(second, UTC)))
    return _date_cache[1]

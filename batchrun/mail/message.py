"""The Message every backend sends: its wire bytes built by hand, names and subjects encoded
and folded (RFC 2047), addresses checked."""

from __future__ import annotations

import base64
import email
import email.policy
import email.quoprimime
import functools
import random
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, parseaddr

from batchrun.mail.address import idna_domain, wire_address
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
            to_header = _address(to_name, to_addr)
        elif utf8:
            to_header = _utf8_address(to_name, to_addr)
        else:
            raise ValueError(f"the local part of {self.to_addr!r} is not ASCII: it needs SMTPUTF8")
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
_MAX_WIRE_LINE = 998  # RFC 5322's hard limit, CRLF excluded


def _extra_header(name: str, value: str) -> str:
    """``CRLF name: value``, or ValueError for a field that could break the header block."""
    line = f"\r\n{name}: {value}"
    if (
        not _field_name(name)
        or _UNSAFE.search(value) is not None
        or not value.isascii()
        or len(line) - 2 > _MAX_WIRE_LINE
    ):
        raise ValueError(f"unusable header field {name!r}: {value[:80]!r}")
    return line


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
    return _address(*parseaddr(sender)) if "<" in sender else sender


def _address(name: str, addr: str, prefix: int = len("From: ")) -> str:
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
            encoded = _encoded_word(name, _MAX_LINE - prefix)
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
    shown = _address(name, "@")  # "@": an ASCII stand-in, replaced below
    return f"{shown[:-2]}{addr}>" if shown.endswith("<@>") else addr


def _encoded_word(text: str, room: int = 75) -> str:
    """``text`` as RFC 2047 encoded words, each the shorter of its B and Q encodings.

    ``Charset("utf-8").header_encode(text)`` when that one word fits in ``room``
    characters. Otherwise words of at most 75 characters (the first at most ``room``),
    cut between characters, never inside one, and joined by CRLF + space (a fold). The
    standard library measures the Q form byte by byte in Python; here one C-level
    ``translate`` counts the bytes Q must escape (3 characters each instead of 1).
    """
    raw = text.encode("utf-8")
    b_length = (len(raw) + 2) // 3 * 4
    q_length = len(raw) + 2 * len(raw.translate(None, _Q_LITERAL))
    fits = min(room, _MAX_WORD) - _WORD_OVERHEAD
    if b_length < q_length:
        if b_length <= fits:
            return f"=?utf-8?b?{base64.b64encode(raw).decode('ascii')}?="
    elif q_length <= fits:
        return email.quoprimime.header_encode(raw, "utf-8")
    return _FOLD.join(_encoded_chunks(raw, fits))


def _encoded_chunks(raw: bytes, first: int) -> list[str]:
    """The words of a folded ``_encoded_word``, the first with ``first`` characters of
    encoded text at most: each word takes as many characters as fit.

    The longest piece whose shorter encoding fits is the longer of the longest that fits
    as B (a byte count) and the longest that fits as Q (found by bisection), moved back
    to the start of the character it ends in.
    """
    words = []
    start = 0
    # At least one 4-byte character's worth (8 as B), so that every word takes one.
    limit = max(first, 8)
    while start < len(raw):
        end = min(len(raw), start + limit // 4 * 3)  # the bytes B fits
        if _q_length(raw[start:end]) <= limit:  # Q fits as many: it may fit more
            low, high = end, min(len(raw), start + limit)
            while low < high:
                middle = (low + high + 1) // 2
                if _q_length(raw[start:middle]) <= limit:
                    low = middle
                else:
                    high = middle - 1
            end = low
        while end < len(raw) and raw[end] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            end -= 1
        chunk = raw[start:end]
        if (len(chunk) + 2) // 3 * 4 < _q_length(chunk):
            words.append(f"=?utf-8?b?{base64.b64encode(chunk).decode('ascii')}?=")
        else:
            words.append(email.quoprimime.header_encode(chunk, "utf-8"))
        start = end
        limit = _MAX_WORD - _WORD_OVERHEAD
    return words


def _q_length(raw: bytes) -> int:
    return len(raw) + 2 * len(raw.translate(None, _Q_LITERAL))


# RFC 2047: an encoded word is at most 75 characters; RFC 5322 asks for lines of at most
# 78, so a fold (CRLF and one space) before each further word always leaves room for it.
_MAX_WORD = 75
_MAX_LINE = 78
_FOLD = "\r\n "
_WORD_OVERHEAD = len("=?utf-8?b??=")
# Bytes the header Q encoding writes as one character (space becomes "_").
_Q_LITERAL = b" !*+-/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# email.utils' specialsre: a name holding any of these is quoted by formataddr.
_NAME_SPECIALS = re.compile(r'[][\\()<>@,:;".]')


@functools.lru_cache(maxsize=16)
def _subject_header(subject: str) -> str:
    """The Subject header value; a job's messages share one subject, so it is cached."""
    return _header_text(clean_text(subject), len("Subject: "))


def _header_text(value: str, prefix: int) -> str:
    """An unstructured header value, folded as encoded words when it is not plain ASCII.

    ``prefix``: the characters (the header's name) before the value on its first line.
    """
    # Text that looks like an encoded word would be decoded by the reader: encode it.
    if value.isascii() and "=?" not in value:
        return value
    return _encoded_word(value, _MAX_LINE - prefix)


_date_cache: tuple[int, str] = (0, "")


def _now_header() -> str:
    """The Date header value, formatted once a second (every message in it shares it)."""
    global _date_cache
    second = int(time.time())
    if _date_cache[0] != second:
        _date_cache = (second, format_datetime(datetime.fromtimestamp(second, UTC)))
    return _date_cache[1]

"""The transfer encoding of a message's text parts: 7bit when plain ASCII allows, else
quoted-printable; never base64, which spam filters hold against text and nobody can read.
An HTML part's non-ASCII characters become character references first (``ascii_html``)."""

from __future__ import annotations

import binascii
import re

MAX_LINE = 998  # RFC 5322's longest line: a text with a longer one cannot go as 7bit
_BLOCK = (MAX_LINE + 1) // 2  # 499: a line of MAX_LINE + 1 covers a whole aligned block


def text_body(text: str) -> tuple[str, bytes]:
    """(Content-Transfer-Encoding, the body on the wire): 7bit when the text is plain
    ASCII in lines of at most 998 characters, which every client reads as it is (and spam
    filters score as ordinary mail, unlike base64 text); else quoted-printable, mostly
    readable too. Line ends become CRLF; the text's own are kept, none is added."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.isascii() and "\0" not in text and not _long_line(text):
        return "7bit", text.encode("ascii").replace(b"\n", b"\r\n")
    # b2a_qp keeps lines within 76 characters and escapes '=', so a boundary (which starts
    # with '=_') can never appear inside it.
    encoded = binascii.b2a_qp(text.encode("utf-8"), istext=True)
    return "quoted-printable", encoded.replace(b"\n", b"\r\n")


def _long_line(text: str) -> bool:
    """Whether a line of ``text`` is longer than ``MAX_LINE``.

    A line of 999 characters or more covers at least one whole block of ``_BLOCK`` (499)
    characters starting at a multiple of 499 (a run of 2k - 1 characters always covers
    one whole aligned block of k). So when every such block holds a line break, which a
    few ``find`` calls tell without copying, no line is too long; only a text with a
    block free of line breaks is split to measure its lines.
    """
    if len(text) <= MAX_LINE:
        return False
    find = text.find
    if all(
        find("\n", start, start + _BLOCK) >= 0 for start in range(0, len(text) - _BLOCK + 1, _BLOCK)
    ):
        return False
    return max(map(len, text.split("\n"))) > MAX_LINE


# Elements whose text an HTML reader takes as it is, with no character reference read.
_RAW_TAGS = "script|style|xmp|iframe|noembed|noframes|noscript"
_RAW_TAG = re.compile(rf"<(?:{_RAW_TAGS}|plaintext)\b".encode(), re.IGNORECASE)
_RAW_TEXT = re.compile(rf"<({_RAW_TAGS})\b.*?</\1\s*>|<plaintext\b.*", re.IGNORECASE | re.DOTALL)


def ascii_html(html: str) -> str:
    """``html`` with each non-ASCII character as a character reference (``é`` as
    ``&#233;``), which every HTML reader turns back into the same character: the part can
    then go as 7bit, not quoted-printable, whose encoding is a tenth of a message's CPU
    for a user with an accent in her name. Unchanged where a non-ASCII character sits in
    an element whose text is not read for references (``<style>``, ``<script>`` ...)."""
    if html.isascii():
        return html
    referenced = html.encode("ascii", "xmlcharrefreplace")
    if _RAW_TAG.search(referenced) and any(
        not m.group().isascii() for m in _RAW_TEXT.finditer(html)
    ):
        return html
    return referenced.decode("ascii")


def body_part(boundary: str, subtype: str, body: str) -> bytes:
    """One part of the multipart/alternative, ending with the CRLF its delimiter takes."""
    encoding, encoded = text_body(ascii_html(body) if subtype == "html" else body)
    head = (
        f'--{boundary}\r\nContent-Type: text/{subtype}; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    )
    # The CRLF before the next delimiter belongs to the delimiter (RFC 2046), not the text.
    return head.encode("ascii") + encoded + b"\r\n"

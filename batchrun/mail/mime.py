"""The transfer encoding of a message's text parts: 7bit when plain ASCII allows, else
quoted-printable; never base64, which spam filters hold against text and nobody can read.
An HTML part's non-ASCII characters become character references first (``ascii_html``)."""

from __future__ import annotations

import binascii
import re

MAX_LINE = 998  # RFC 5322's longest line: a text with a longer one cannot go as 7bit


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

    From each line start it looks for the last line break within the next ``MAX_LINE + 1``
    characters (one C-level ``rfind``): none means the line there is too long; otherwise
    every line that starts before that break is short, and the search goes on after it.
    A few searches for a text of a few kB, without copying it.
    """
    rfind = text.rfind
    start = 0
    rest = len(text)
    while rest > MAX_LINE:
        end = rfind("\n", start, start + MAX_LINE + 1)
        if end < 0:
            return True
        rest -= end + 1 - start
        start = end + 1
    return False


# What a character reference would not carry through an HTML reader: an element whose text
# is read as it is (<style>, <script> ...: a reference there stays "&#233;"), the C1 controls
# (readers take &#128;-&#159; as Windows-1252: &#128; is the euro sign) and lone surrogates
# (no characters: as UTF-8 they fail to encode, as they did before). Two searches: one
# pattern with both alternatives costs twice their sum.
_RAW_TEXT_ELEMENT = re.compile(
    rb"<(?:script|style|xmp|iframe|noembed|noframes|noscript|plaintext)\b", re.IGNORECASE
)
_NOT_CARRIED = re.compile(rb"&#(?:1[2-5][0-9]|5[5-7][0-9]{3});")


def ascii_html(html: str) -> str:
    """``html`` with each non-ASCII character as a character reference (``é`` as
    ``&#233;``), which an HTML reader turns back into the same character: the part can
    then go as 7bit, not quoted-printable, whose encoding is a tenth of a message's CPU
    for a user with an accent in her name. Unchanged when the HTML has an element whose
    text is not read for references (``<style>``, ``<script>`` ...), or a character a
    reference would not carry (see ``_NOT_CARRIED``): such a part stays
    quoted-printable, as before."""
    if html.isascii():
        return html
    referenced = html.encode("ascii", "xmlcharrefreplace")
    if _NOT_CARRIED.search(referenced) or _RAW_TEXT_ELEMENT.search(referenced):
        return html
    return referenced.decode("ascii")


def body_part(boundary: str, subtype: str, body: str) -> bytes:
    """One part of the multipart/alternative, ending with the CRLF its delimiter takes."""
    if subtype == "html" and (referenced := ascii_html(body)) is not body:
        encoding, encoded = text_body(referenced)
        if encoding != "7bit":  # a line too long even so: the original, quoted-printable
            encoding, encoded = text_body(body)
    else:
        encoding, encoded = text_body(body)
    head = (
        f'--{boundary}\r\nContent-Type: text/{subtype}; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    )
    # The CRLF before the next delimiter belongs to the delimiter (RFC 2046), not the text.
    return head.encode("ascii") + encoded + b"\r\n"

"""The transfer encoding of a message's text parts: 7bit when plain ASCII allows, else
quoted-printable; never base64, which spam filters hold against text and nobody can read."""

from __future__ import annotations

import binascii

MAX_LINE = 998  # RFC 5322's longest line: a text with a longer one cannot go as 7bit


def text_body(text: str) -> tuple[str, bytes]:
    """(Content-Transfer-Encoding, the body on the wire): 7bit when the text is plain
    ASCII in lines of at most 998 characters, which every client reads as it is (and spam
    filters score as ordinary mail, unlike base64 text); else quoted-printable, mostly
    readable too. Line ends become CRLF; the text's own are kept, none is added."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.isascii() and "\0" not in text and not _long_line(text):
        return "7bit", text.replace("\n", "\r\n").encode("ascii")
    # b2a_qp keeps lines within 76 characters and escapes '=', so a boundary (which starts
    # with '=_') can never appear inside it.
    encoded = binascii.b2a_qp(text.encode("utf-8"), istext=True)
    return "quoted-printable", encoded.replace(b"\n", b"\r\n")


def _long_line(text: str) -> bool:
    """Whether a line of ``text`` is longer than ``MAX_LINE``: a short text has none, and
    splitting is some 15x cheaper than a regex that tries a match at every character."""
    return len(text) > MAX_LINE and max(map(len, text.split("\n"))) > MAX_LINE


def body_part(boundary: str, subtype: str, body: str) -> bytes:
    """One part of the multipart/alternative, ending with the CRLF its delimiter takes."""
    encoding, encoded = text_body(body)
    head = (
        f'--{boundary}\r\nContent-Type: text/{subtype}; charset="utf-8"\r\n'
        f"Content-Transfer-Encoding: {encoding}\r\n\r\n"
    )
    # The CRLF before the next delimiter belongs to the delimiter (RFC 2046), not the text.
    return head.encode("ascii") + encoded + b"\r\n"

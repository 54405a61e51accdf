"""Header values within RFC 5322's line limits: folding at spaces, and RFC 2047 encoded
words for text that is not plain ASCII (or has a word no line can hold).

RFC 5322 asks for lines of at most 78 characters and forbids more than 998; a mail server
refuses a longer line (``500 Line too long``) and the message with it.
"""

from __future__ import annotations

import base64
import email.quoprimime

# RFC 2047: an encoded word is at most 75 characters; RFC 5322 asks for lines of at most
# 78, so a fold (CRLF and one space) before each further word always leaves room for it.
_MAX_WORD = 75
_MAX_LINE = 78
_FOLD = "\r\n "
_WORD_OVERHEAD = len("=?utf-8?b??=")
# Bytes the header Q encoding writes as one character (space becomes "_").
_Q_LITERAL = b" !*+-/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_MAX_WIRE_LINE = 998  # RFC 5322's hard limit, CRLF excluded


def fold(value: str, prefix: int) -> str | None:
    """``value`` folded (RFC 5322 section 2.2.3): a CRLF put before a space wherever a line
    would pass 78 characters, so that unfolding gives ``value`` back; None when a word
    (no space to fold at) leaves a line over the hard limit of 998.

    ``prefix``: the characters (the field's name and ": ") before the value on its first
    line. Never folds before a space that would leave a line of spaces alone. A value
    that fits costs one comparison: the common case, every message.
    """
    if prefix + len(value) <= _MAX_LINE:
        return value
    lines: list[str] = []
    line = ""
    width = prefix
    longest = 0
    for i, word in enumerate(value.split(" ")):
        if i == 0:
            line, width = word, width + len(word)
        elif word and line.strip() and width + 1 + len(word) > _MAX_LINE:
            lines.append(line)
            longest = max(longest, width)
            line, width = f" {word}", 1 + len(word)
        else:
            line += f" {word}"
            width += 1 + len(word)
    lines.append(line)
    if max(longest, width) > _MAX_WIRE_LINE:
        return None
    return "\r\n".join(lines)


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


def _header_text(value: str, prefix: int) -> str:
    """An unstructured header value, folded as encoded words when it is not plain ASCII.

    ``prefix``: the characters (the header's name) before the value on its first line.
    """
    # Text that looks like an encoded word would be decoded by the reader: encode it.
    if value.isascii() and "=?" not in value:
        folded = fold(value, prefix)
        if folded is not None:
            return folded
        # A word too long for any line: encoded words can be cut anywhere.
    return _encoded_word(value, _MAX_LINE - prefix)

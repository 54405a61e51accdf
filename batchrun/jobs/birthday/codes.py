"""Gift codes: 16 Crockford base32 characters from ``secrets`` (80 bits)."""

from __future__ import annotations

import secrets

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: no I, L, O, U
LENGTH = 16
# A random byte becomes the symbol of its low five bits: 256 is a multiple of 32, so a
# uniform byte gives a uniform symbol (one C-level translate, where base32 loops in Python).
_TO_SYMBOL = bytes.maketrans(bytes(range(256)), ALPHABET.encode() * 8)


def new_codes(count: int) -> list[str]:
    """``count`` fresh random gift codes, stored without separators.

    One system call for all of them; each code is sixteen independent symbols, each
    uniform over the alphabet: an 80-bit draw.
    """
    text = secrets.token_bytes(count * LENGTH).translate(_TO_SYMBOL).decode("ascii")
    return [text[i : i + LENGTH] for i in range(0, count * LENGTH, LENGTH)]


def new_code() -> str:
    """A fresh random gift code."""
    return new_codes(1)[0]


def display(code: str) -> str:
    """The code grouped for people: XXXX-XXXX-XXXX-XXXX."""
    if len(code) == LENGTH:  # every code new_codes makes: no generator per message
        return f"{code[:4]}-{code[4:8]}-{code[8:12]}-{code[12:]}"
    return "-".join(code[i : i + 4] for i in range(0, len(code), 4))

"""Gift codes: 16 Crockford base32 characters from ``secrets`` (80 bits)."""

from __future__ import annotations

import base64
import secrets

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: no I, L, O, U
LENGTH = 16
_BYTES = LENGTH * 5 // 8  # 80 bits: base32 turns every 5 bytes into 8 symbols, no padding
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", ALPHABET.encode())


def new_codes(count: int) -> list[str]:
    """``count`` fresh random gift codes, stored without separators.

    One system call for all of them; each code is an independent 80-bit draw cut into
    sixteen 5-bit symbols, so every symbol is uniform over the alphabet.
    """
    symbols = base64.b32encode(secrets.token_bytes(count * _BYTES)).translate(_TO_CROCKFORD)
    text = symbols.decode("ascii")
    return [text[i : i + LENGTH] for i in range(0, count * LENGTH, LENGTH)]


def new_code() -> str:
    """A fresh random gift code."""
    return new_codes(1)[0]


def display(code: str) -> str:
    """The code grouped for people: XXXX-XXXX-XXXX-XXXX."""
    return "-".join(code[i : i + 4] for i in range(0, len(code), 4))

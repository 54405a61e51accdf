"""Gift codes: 16 Crockford base32 characters from ``secrets`` (80 bits)."""

from __future__ import annotations

import secrets

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: no I, L, O, U
LENGTH = 16


def new_code() -> str:
    """A fresh random gift code, stored without separators."""
    # One 80-bit draw cut into sixteen 5-bit symbols: every symbol uniform and independent,
    # and one system call instead of sixteen.
    bits = int.from_bytes(secrets.token_bytes(LENGTH * 5 // 8), "big")
    return "".join(ALPHABET[(bits >> (5 * i)) & 31] for i in range(LENGTH))


def display(code: str) -> str:
    """The code grouped for people: XXXX-XXXX-XXXX-XXXX."""
    return "-".join(code[i : i + 4] for i in range(0, len(code), 4))

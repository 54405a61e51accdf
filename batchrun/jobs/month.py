"""Month arguments: strict ``YYYY-MM``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

_MONTH = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])")


@dataclass(frozen=True, slots=True, order=True)
class Month:
    """A calendar month; the card it creates is for ``year``."""

    year: int
    month: int

    def __str__(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @classmethod
    def current(cls, now: datetime | None = None) -> Month:
        """The current month in UTC."""
        now = now or datetime.now(UTC)
        if now.tzinfo is not None:
            now = now.astimezone(UTC)  # a naive time is taken to be UTC already
        return cls(now.year, now.month)


def parse_month(text: str) -> Month:
    """Parse ``YYYY-MM``; raise ValueError with a one-line reason otherwise."""
    match = _MONTH.fullmatch(text.strip()) if text else None
    if not match or int(match[1]) < 1900:
        raise ValueError(f"invalid month {text!r}: expected YYYY-MM, e.g. 2025-06")
    return Month(int(match[1]), int(match[2]))

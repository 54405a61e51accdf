"""Periods a job runs for: a year ``2025``, a month ``2025-06`` or a day ``2025-06-01``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

Unit = Literal["year", "month", "day"]
UNITS: tuple[Unit, ...] = ("day", "month", "year")  # shortest first
_EXAMPLE = {"year": "2025", "month": "2025-06", "day": "2025-06-01"}
_FORMAT = {"year": "YYYY", "month": "YYYY-MM", "day": "YYYY-MM-DD"}
# A month may be written 2025-6; a day 2025-6-1. Nothing else: "June" or "06-2025" are
# ambiguous, and a typo should fail, not run another period.
_PATTERN = {
    "year": re.compile(r"([0-9]{4})"),
    "month": re.compile(r"([0-9]{4})-([0-9]{1,2})"),
    "day": re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})"),
}


@dataclass(frozen=True, slots=True, order=True)
class Period:
    """One calendar period; ``start`` is its first day, ``end`` the day after its last."""

    start: date
    unit: Unit

    @property
    def end(self) -> date:
        if self.unit == "day":
            return self.start + timedelta(days=1)
        if self.unit == "month":
            year, month = divmod(self.start.month, 12)
            return date(self.start.year + year, month + 1, 1)
        return date(self.start.year + 1, 1, 1)

    @property
    def year(self) -> int:
        return self.start.year

    @property
    def month(self) -> int:
        return self.start.month

    def __str__(self) -> str:
        if self.unit == "year":
            return f"{self.start.year:04d}"
        if self.unit == "month":
            return f"{self.start.year:04d}-{self.start.month:02d}"
        return self.start.isoformat()

    def within(self, unit: Unit) -> Period:
        """The period of ``unit`` (as long as this one or longer) that contains this one."""
        if UNITS.index(unit) < UNITS.index(self.unit):
            raise ValueError(f"a {unit} does not contain a {self.unit}")
        return containing(unit, self.start)


def containing(unit: Unit, day: date) -> Period:
    """The period of ``unit`` that contains ``day``."""
    if unit == "year":
        return Period(date(day.year, 1, 1), "year")
    if unit == "month":
        return Period(date(day.year, day.month, 1), "month")
    return Period(day, "day")


def current(unit: Unit, now: datetime | None = None) -> Period:
    """The period of ``unit`` containing ``now`` (default: the present), in UTC."""
    now = now or datetime.now(UTC)
    if now.tzinfo is not None:
        now = now.astimezone(UTC)  # a naive time is taken to be UTC already
    return containing(unit, now.date())


def parse(unit: Unit, text: str) -> Period:
    """Parse the text of a period of ``unit``; raise ValueError with a one-line reason."""
    match = _PATTERN[unit].fullmatch(text.strip()) if text else None
    try:
        if match is None:
            raise ValueError
        parts = [int(group) for group in match.groups()]
        if parts[0] < 1900:
            raise ValueError
        start = date(parts[0], *(parts[1:] or [1]), *([1] if unit == "month" else []))
    except ValueError:
        raise ValueError(
            f"invalid {unit} {text!r}: expected {_FORMAT[unit]}, e.g. {_EXAMPLE[unit]}"
        ) from None
    return containing(unit, start)

"""Month arguments (``--month``): the birthday job's period, under its batchrun 0.1 names."""

from __future__ import annotations

from datetime import date, datetime

from batchrun.period import Period, current, parse


class Month:
    """``Month(2025, 6)`` is ``Period(date(2025, 6, 1), "month")``."""

    def __new__(cls, year: int, month: int) -> Period:  # type: ignore[misc]
        return Period(date(year, month, 1), "month")

    @staticmethod
    def current(now: datetime | None = None) -> Period:
        """The current month in UTC."""
        return current("month", now)


def parse_month(text: str) -> Period:
    """Parse ``YYYY-MM`` (or ``YYYY-M``); raise ValueError with a one-line reason otherwise."""
    return parse("month", text)

"""Periods as tests write them: ``month(2025, 6)`` for the birthday job's June 2025."""

from __future__ import annotations

from datetime import date, datetime

from batchrun.period import Period, current, parse


def month(year: int, number: int) -> Period:
    """``Period(date(year, number, 1), "month")``."""
    return Period(date(year, number, 1), "month")


def current_month(now: datetime | None = None) -> Period:
    """The current month in UTC."""
    return current("month", now)


def parse_month(text: str) -> Period:
    """``YYYY-MM`` (or ``YYYY-M``), as ``--month`` takes it."""
    return parse("month", text)

"""The birthday job's ``db explain`` verdict: whether its page query reads the month
through ``idx_user_birth_month_status_id`` in id order, and how many rows a page examines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from batchrun.db.plans import PG_SCAN

INDEX = "idx_user_birth_month_status_id"
_SQLITE = re.compile(
    r"^(?P<op>SEARCH|SCAN) (?:TABLE )?(?P<table>\S+)"
    r"(?: USING (?:COVERING )?(?:INDEX (?P<index>\S+)|(?P<pk>INTEGER PRIMARY KEY)))?"
    r"(?: \((?P<terms>.*)\))?"
)


def verdict(dialect: str, plan: Sequence[dict[str, Any]], page_size: int = 500) -> str:
    """One line: the index the page query uses and how many rows a page examines."""
    if dialect == "sqlite":
        return _sqlite(plan, page_size)
    if dialect == "postgresql":
        return _postgresql(plan, page_size)
    return _mysql(plan, page_size)


def _sqlite(plan: Sequence[dict[str, Any]], page_size: int) -> str:
    details = [str(row.get("detail", "")) for row in plan]
    sorts = any("TEMP B-TREE" in d for d in details)
    found = next((m for d in details if (m := _SQLITE.match(d)) and m["table"] == "user"), None)
    if found is None:
        return f"unknown: no step of the plan reads the user table ({'; '.join(details)})"
    if found["index"] == INDEX and not sorts:
        return (
            f"ok: the page query uses {INDEX} ({found['terms']}), in id order with no sort: "
            f"at most {page_size} rows examined per page of {page_size}"
        )
    how = f"index {found['index']}" if found["index"] else found["pk"] or "no index"
    return _bad(how, sorts, "the whole month's users (or the whole table)")


def _mysql(plan: Sequence[dict[str, Any]], page_size: int) -> str:
    row = next((r for r in plan if r.get("table") == "user"), None)
    if row is None:
        return "unknown: no step of the plan reads the user table"
    key = row.get("key")
    estimate = int(row.get("rows") or 0)
    extra = str(row.get("Extra") or "")
    sorts = "filesort" in extra or "temporary" in extra
    if key == INDEX and not sorts:
        return (
            f"ok: the page query uses {INDEX} ({row.get('type')} on birth_month, status, id), "
            f"in id order with no sort: at most {min(page_size, estimate)} rows examined per "
            f"page of {page_size} (the month's range: about {estimate} rows)"
        )
    how = f"index {key}" if key else f"no index ({row.get('type')})"
    return _bad(how, sorts, f"about {estimate} rows")


def _postgresql(plan: Sequence[dict[str, Any]], page_size: int) -> str:
    lines = [str(next(iter(row.values()), "")) for row in plan]
    scans = [m for line in lines if (m := PG_SCAN.search(line))]
    if not scans:
        return "unknown: no step of the plan reads the user table"
    sorts = any(line.lstrip(" ->").startswith("Sort") for line in lines)
    index = next((m[2] for m in scans if m[1] != "Seq Scan on"), None)
    ordered = any(m[1] != "Bitmap Index Scan on" and m[2] == INDEX for m in scans)
    if ordered and not sorts:
        return (
            f"ok: the page query uses {INDEX} (a range of EXTRACT(MONTH FROM date_of_birth), "
            f"status, id), in id order with no sort: at most {page_size} rows examined per "
            f"page of {page_size}"
        )
    how = f"index {index}" if index else "no index (a sequential scan)"
    return _bad(how, sorts, "the whole month's users (or the whole table)")


SMALL_TABLE_BYTES = 1 << 20  # a table PostgreSQL may rightly read whole (~10k users)


def postgresql_index_unused(line: str, has_index: bool, estimate: int, size: int) -> str:
    """The verdict ``line`` (not ok) said again once we know the index exists: a planner
    that reads a small table whole is right to, and a large one wants statistics.

    ``estimate``: the planner's rows (-1 before the first ANALYZE); ``size``: bytes."""
    if not has_index or not line.startswith("slow:"):
        return line
    if size <= SMALL_TABLE_BYTES:
        rows = f"about {estimate} rows" if estimate >= 0 else f"{size // 1024} KB"
        return (
            f"ok: {INDEX} exists; on a table this small ({rows}) PostgreSQL reads it whole "
            "instead, which is cheaper; it reads through the index as the table grows"
        )
    counted = "never analyzed" if estimate < 0 else f"about {estimate} rows"
    return f'{line.partition("; run")[0]}; the index exists ({counted}): run ANALYZE "user"'


def _bad(how: str, sorts: bool, rows: str) -> str:
    sort = ", then sorts them" if sorts else ""
    return (
        f"slow: the page query uses {how}, not {INDEX}: each page examines {rows}{sort}; "
        "run `batchrun db migrate` to create the index"
    )

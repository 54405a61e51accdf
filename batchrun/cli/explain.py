"""``db explain``'s verdict: which index the birthday page query uses, rows read per page.

The plan rows are the database's own (SQLite's EXPLAIN QUERY PLAN, MySQL/MariaDB's and
PostgreSQL's EXPLAIN);
``verdict`` turns them into one line a person can act on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

INDEX = "idx_user_birth_month_status_id"
PAGE_SIZE = 500  # the LIMIT the plan is asked for: the default --page-size
_SQLITE = re.compile(
    r"^(?P<op>SEARCH|SCAN) (?:TABLE )?(?P<table>\S+)"
    r"(?: USING (?:COVERING )?(?:INDEX (?P<index>\S+)|(?P<pk>INTEGER PRIMARY KEY)))?"
    r"(?: \((?P<terms>.*)\))?"
)


def verdict(dialect: str, plan: Sequence[dict[str, Any]], page_size: int = PAGE_SIZE) -> str:
    """One line: the index the page query uses and how many rows a page examines."""
    if dialect == "sqlite":
        return _sqlite(plan, page_size)
    if dialect == "postgresql":
        return _postgresql(plan, page_size)
    return _mysql(plan, page_size)


def good(line: str) -> bool:
    """Whether a verdict says the page query uses the index as meant."""
    return line.startswith("ok:")


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


_PG_SCAN = re.compile(
    r"(Seq Scan on|Index Only Scan using|Index Scan using|Bitmap Index Scan on) (\S+)"
)


def _postgresql(plan: Sequence[dict[str, Any]], page_size: int) -> str:
    lines = [str(next(iter(row.values()), "")) for row in plan]
    scans = [m for line in lines if (m := _PG_SCAN.search(line))]
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


def _bad(how: str, sorts: bool, rows: str) -> str:
    sort = ", then sorts them" if sorts else ""
    return (
        f"slow: the page query uses {how}, not {INDEX}: each page examines {rows}{sort}; "
        "run `batchrun db migrate` to create the index"
    )


# -- any job's page query ----------------------------------------------------------------------

_SQLITE_STEP = re.compile(
    r"^(?P<op>SEARCH|SCAN) (?:TABLE )?(?P<table>\S+)"
    r"(?: USING (?:COVERING )?(?:INDEX (?P<index>\S+)|(?P<pk>INTEGER PRIMARY KEY)))?"
)


def page_verdict(
    job: str, dialect: str, plans: Sequence[tuple[str, Sequence[dict[str, Any]]]], page_size: int
) -> str:
    """One line for a job's page queries: the index each reads through, or what is slow."""
    if not plans:
        return f"unknown: {job}'s page runs no query through ctx.db"
    found: list[str] = []
    slow: list[str] = []
    for _, plan in plans:
        reads, problems = _reads(dialect, plan)
        found += reads
        slow += problems
    if slow:
        reading = f"reads {', '.join(found)}, but " if found else ""
        said = "; ".join(dict.fromkeys(slow))
        return (
            f"slow: {job}'s page query {reading}{said}: each page examines more rows than "
            "it returns; give it an index on the WHERE columns, then id (a migrate_* step of "
            "the job's SqlFolder)"
        )
    return (
        f"ok: {job}'s page query reads {', '.join(found) or 'no table'}, in id order with no "
        f"sort: at most {page_size} rows examined per page of {page_size}"
    )


def _reads(dialect: str, plan: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(tables read through an index, problems) of one plan."""
    reads: list[str] = []
    slow: list[str] = []
    if dialect == "sqlite":
        for row in plan:
            detail = str(row.get("detail", ""))
            if "TEMP B-TREE" in detail:
                slow.append("sorts its rows (a temporary b-tree)")
            step = _SQLITE_STEP.match(detail)
            if step is None:
                continue
            if step["index"] and step["op"] == "SEARCH":
                reads.append(f"{step['table']} through {step['index']}")
            elif step["op"] == "SCAN":
                slow.append(f"scans all of {step['table']}")
            else:
                slow.append(f"reads {step['table']} by id alone (no index on its filter)")
    elif dialect == "postgresql":
        for row in plan:
            line = str(next(iter(row.values()), ""))
            if line.lstrip(" ->").startswith("Sort"):
                slow.append("sorts its rows")
            scan = _PG_SCAN.search(line)
            if scan is None:
                continue
            if scan[1] == "Seq Scan on":
                slow.append(f"scans all of {scan[2]} (a sequential scan)")
            else:
                reads.append(f"through {scan[2]}")
    else:
        for row in plan:
            table, key, extra = row.get("table"), row.get("key"), str(row.get("Extra") or "")
            if "filesort" in extra or "temporary" in extra:
                slow.append(f"sorts the rows of {table}")
            if row.get("type") == "ALL" or not key:
                slow.append(f"scans all of {table} (about {row.get('rows')} rows)")
            elif key == "PRIMARY":
                slow.append(f"reads {table} by id alone (no index on its filter)")
            else:
                reads.append(f"{table} through {key}")
    return reads, slow

"""``db explain``'s verdict on any job's page query: the index each query reads through,
or what is slow, from the database's own plan rows (SQLite's EXPLAIN QUERY PLAN,
MySQL/MariaDB's and PostgreSQL's EXPLAIN). A job with a verdict of its own (the birthday
job's, naming its index) gives it through ``Job.explain``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from batchrun.db.plans import PG_SCAN

PAGE_SIZE = 500  # the LIMIT the plan is asked for: the default --page-size


def good(line: str) -> bool:
    """Whether a verdict says the page query uses the index as meant."""
    return line.startswith("ok:")


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
    for sql, plan in plans:
        reads, problems = _reads(dialect, plan, by_id_only=_filters_on_id_only(sql))
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


_WHERE = re.compile(r"\bWHERE\b(.*?)(?:\bORDER\s+BY\b|\bGROUP\s+BY\b|\bLIMIT\b|$)", re.I | re.S)
_ORDER = re.compile(r"\bORDER\s+BY\s+(?:\w+\.)?(\w+)", re.I)
_RANGE = r"(?:\b\w+\.)?\b{column}\s*(?:>=|<=|>|<)\s*(?:\?|%s|\$\d+|:\w+)"


def _filters_on_id_only(sql: str) -> bool:
    """Whether the query's only filter is its id range (``id > :after``, or the column it
    is ordered by, ``customer_id > :after``): read by id, each page examines the rows it
    returns, and no index could do better."""
    where = _WHERE.search(sql)
    if where is None:
        return False
    order = _ORDER.search(sql)
    columns = {"id"} | ({order[1].lower()} if order else set())
    rest = where[1]
    for column in columns:
        rest = re.sub(_RANGE.format(column=re.escape(column)), "", rest, flags=re.I)
    return re.sub(r"\bAND\b|[()\s]", "", rest, flags=re.I) == ""


def _reads(
    dialect: str, plan: Sequence[dict[str, Any]], *, by_id_only: bool = False
) -> tuple[list[str], list[str]]:
    """(tables read through an index, problems) of one plan; ``by_id_only``: the query
    filters on its id range alone, so a read by the primary key is the right one."""
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
            elif by_id_only:
                reads.append(f"{step['table']} by id (its only filter)")
            else:
                slow.append(f"reads {step['table']} by id alone (no index on its filter)")
    elif dialect == "postgresql":
        for row in plan:
            line = str(next(iter(row.values()), ""))
            if line.lstrip(" ->").startswith("Sort"):
                slow.append("sorts its rows")
            scan = PG_SCAN.search(line)
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
            elif key == "PRIMARY" and by_id_only:
                reads.append(f"{table} by id (its only filter)")
            elif key == "PRIMARY":
                slow.append(f"reads {table} by id alone (no index on its filter)")
            else:
                reads.append(f"{table} through {key}")
    return reads, slow

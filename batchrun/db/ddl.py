"""What a schema step does: which table, which algorithm and lock it states, how many rows.

On MySQL/MariaDB every DDL on an application table states ``ALGORITHM=INSTANT`` or
``ALGORITHM=INPLACE, LOCK=NONE``, so the server refuses a change it cannot make online
rather than copy the table under a write lock. ``db migrate --plan`` reads these clauses;
``--allow-locking`` runs a refused step again without them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from batchrun.db.sql import Statement
from batchrun.errors import DatabaseError


def _ident(group: str) -> str:
    return rf"[`\"]?(?P<{group}>\w+)[`\"]?"


_TARGET = re.compile(
    # PostgreSQL's index steps first drop an INVALID leftover of an interrupted build.
    r"^\s*(?:DROP\s+INDEX\s+CONCURRENTLY\s+IF\s+EXISTS\s+\w+\s*;\s*)?(?:"
    rf"(?P<create>CREATE\s+TABLE)(?:\s+IF\s+NOT\s+EXISTS)?\s+{_ident('create_t')}"
    rf"|(?P<alter>ALTER\s+TABLE)\s+{_ident('alter_t')}"
    rf"|(?P<index>CREATE\s+(?:UNIQUE\s+)?INDEX)(?:\s+CONCURRENTLY)?(?:\s+IF\s+NOT\s+EXISTS)?\s+\w+\s+ON\s+{_ident('index_t')}"
    rf"|(?P<insert>INSERT(?:\s+OR\s+IGNORE|\s+IGNORE)?\s+INTO)\s+{_ident('insert_t')}"
    r")",
    re.IGNORECASE,
)
_ALGORITHM = re.compile(r"\bALGORITHM\s*=\s*(\w+)", re.IGNORECASE)
_LOCK = re.compile(r"\bLOCK\s*=\s*(\w+)", re.IGNORECASE)
_CONCURRENTLY = re.compile(r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\b", re.IGNORECASE)
# ", ALGORITHM=INSTANT" / ", ALGORITHM=INPLACE, LOCK=NONE" at the end of an ALTER TABLE's
# list of changes (or alone, when a job writes them first).
_ONLINE_CLAUSE = re.compile(r"\s*,?\s*\b(?:ALGORITHM|LOCK)\s*=\s*\w+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step ``db migrate`` would run, as ``--plan`` shows it."""

    step: str  # the name recorded in batchrun_schema (a job's steps: ``job.migrate_...``)
    statement: str  # create table, alter table, create index, insert (a data step), other
    table: str | None
    algorithm: str | None  # as the step states it (None: the statement states none)
    lock: str | None
    rows: int | None  # the table's row estimate now (None: the table does not exist yet)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def describe(name: str, step: Statement, rows: int | None = None) -> StepPlan:
    """The table, statement kind, algorithm and lock of ``step`` (read from its text)."""
    text = step.text
    match = _TARGET.match(text)
    kind, table = "other", None
    if match is not None:
        for group, label in (
            ("create", "create table"),
            ("alter", "alter table"),
            ("index", "create index"),
            ("insert", "insert"),
        ):
            if match.group(group):
                kind = label
                table = match.group(f"{group}_t")
                break
    algorithm = _ALGORITHM.search(text)
    lock = _LOCK.search(text)
    concurrently = _CONCURRENTLY.search(text)  # PostgreSQL: writes go on during the build
    return StepPlan(
        step=name,
        statement=kind,
        table=table,
        algorithm=(
            algorithm.group(1).upper() if algorithm else "CONCURRENTLY" if concurrently else None
        ),
        lock=lock.group(1).upper() if lock else None,
        rows=rows,
    )


def without_online_clause(step: Statement) -> Statement:
    """``step`` with its ``ALGORITHM=`` and ``LOCK=`` clauses taken out: the server then
    picks the algorithm, a table copy under a write lock if it must (``--allow-locking``)."""
    return Statement(step.name, _ONLINE_CLAUSE.sub("", step.text).strip(), step.unless)


class NotOnlineError(DatabaseError):
    """The server refused a step's stated ALGORITHM or LOCK: it cannot run it online.

    ``reason`` is the server's own words (``ALGORITHM=INSTANT is not supported for this
    operation. Try ALGORITHM=COPY``).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refused(plan: StepPlan, reason: str) -> DatabaseError:
    """The one line a refused step stops ``db migrate`` with."""
    on = f" on {plan.table}" if plan.table else ""
    rows = f" ({plan.rows:,} rows)" if plan.rows is not None else ""
    return DatabaseError(
        f"step {plan.step}{on}{rows} cannot run online: {reason}; the steps before it are "
        "applied, nothing after it. Run `batchrun db migrate --allow-locking` to let the "
        f"server lock {plan.table or 'the table'} while it changes it (a MyISAM or Aria "
        "table never changes online: convert it to InnoDB)"
    )


def plan_lines(plans: list[StepPlan]) -> list[str]:
    """``--plan`` as aligned text columns: step, table, algorithm, lock, rows."""
    header = ("step", "table", "statement", "algorithm", "lock", "rows")
    rows = [
        (
            p.step,
            p.table or "-",
            p.statement,
            p.algorithm or "-",
            p.lock or "-",
            "-" if p.rows is None else f"{p.rows:,}",
        )
        for p in plans
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(w) if i == len(header) - 1 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]

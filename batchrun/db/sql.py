"""Named queries loaded from ``batchrun/sql/<dialect>/*.sql`` (aiosql-style ``-- name:`` blocks).

Parameters are written ``:name``. ``:name*`` expands a list: a list of scalars becomes
``(?, ?, ?)`` (for ``IN``), a list of tuples becomes ``(?, ?), (?, ?)`` (for multi-row
``VALUES``); on PostgreSQL the marks are numbered ``$1, $2, ...`` in order. Only
placeholders are generated; values are always bound by the driver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^--\s*name:\s*([\w.-]+)\s*$", re.MULTILINE)
# Quoted strings and comments are matched first so a ':' inside them is never a parameter.
# Standard SQL (SQLite, PostgreSQL): a quote is escaped by doubling it, a backslash is a
# character like any other, but for PostgreSQL's E'...' strings, where it escapes.
_PARAM = r"--[^\n]*|/\*.*?\*/|(?<![:\w]):([A-Za-z_]\w*)(\*?)|%"
_TOKEN = re.compile(
    r"(?<!\w)[Ee]'(?:[^'\\]|''|\\.)*'|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`(?:[^`]|``)*`|" + _PARAM,
    re.DOTALL,
)
# MySQL: a backslash escapes the next character in '...' and "..." strings ('it\'s :x').
_MYSQL_TOKEN = re.compile(
    r"'(?:[^'\\]|''|\\.)*'|\"(?:[^\"\\]|\"\"|\\.)*\"|`(?:[^`]|``)*`|" + _PARAM, re.DOTALL
)


@dataclass(frozen=True, slots=True)
class Statement:
    """One named query: its text and the guards (``-- unless:`` lines) that skip it."""

    name: str
    text: str
    unless: tuple[str, ...] = ()


@dataclass(slots=True)
class Queries:
    """The named queries of one dialect, compiled to the driver's placeholder style."""

    dialect: str
    placeholder: str
    statements: dict[str, Statement]
    _cache: dict[tuple[str, tuple[int, ...]], tuple[str, tuple[str, ...]]] = field(
        default_factory=dict
    )

    def compile(self, name: str, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """Return (sql, args) for query ``name`` bound to ``params``."""
        statement = self.statements[name]
        return self.compile_text(statement.name, statement.text, params)

    def compile_text(
        self, key: str, text: str, params: Mapping[str, Any]
    ) -> tuple[str, tuple[Any, ...]]:
        """Compile an already-loaded statement text (migrations use this too)."""
        shape = tuple(
            _shape(value) for _, value in sorted(params.items()) if isinstance(value, list)
        )
        cached = self._cache.get((key, shape))
        if cached is None:
            cached = self._translate(text, params)
            self._cache[(key, shape)] = cached
        sql, order = cached
        args: list[Any] = []
        for param in order:
            value = params[param]
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, tuple):
                        args.extend(item)
                    else:
                        args.append(item)
            else:
                args.append(value)
        return sql, tuple(args)

    def _translate(self, text: str, params: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
        order: list[str] = []
        mark = self.placeholder
        numbered = mark == "$n"  # asyncpg: $1, $2, ... one number per bound value

        used = [0]

        def marks(count: int) -> list[str]:
            if not numbered:
                return [mark] * count
            first = used[0] + 1
            used[0] += count
            return [f"${n}" for n in range(first, first + count)]

        def replace(match: re.Match[str]) -> str:
            whole, name, star = match.group(0), match.group(1), match.group(2)
            if name is None:
                # pymysql applies `query % args` to the whole text, literals included,
                # so every literal % must be doubled there.
                return whole.replace("%", "%%") if mark == "%s" else whole
            if name not in params:
                raise KeyError(f"query parameter :{name} not given")
            order.append(name)
            value = params[name]
            if not star and not isinstance(value, list):
                return marks(1)[0]
            if not isinstance(value, list) or not value:
                raise ValueError(f"query parameter :{name}* needs a non-empty list")
            first = value[0]
            if isinstance(first, tuple):
                width = len(first)
                return ", ".join("(" + ", ".join(marks(width)) + ")" for _ in value)
            return "(" + ", ".join(marks(len(value))) + ")"

        token = _MYSQL_TOKEN if self.dialect == "mysql" else _TOKEN
        return token.sub(replace, text), tuple(order)


def _shape(value: list[Any]) -> int:
    return len(value) * 1000 + (len(value[0]) if value and isinstance(value[0], tuple) else 0)


def parse(text: str) -> dict[str, Statement]:
    """Split a ``.sql`` file into its named statements."""
    statements: dict[str, Statement] = {}
    parts = _NAME.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip().splitlines()
        unless = tuple(
            line.split(":", 1)[1].strip() for line in lines if line.startswith("-- unless:")
        )
        sql_lines = [line for line in lines if not line.lstrip().startswith("--")]
        sql = "\n".join(sql_lines).strip().rstrip(";").strip()
        if name in statements:
            raise ValueError(f"query {name} defined twice")
        statements[name] = Statement(name=name, text=sql, unless=unless)
    return statements


class SqlFolder:
    """Named queries in ``<folder>/<dialect>/*.sql``, with ``<folder>/common/*.sql`` for the
    blocks every dialect shares (a dialect's own block of the same name wins).

    Args:
        folder: a path, or a package resource (``importlib.resources.files(...)``).
    """

    def __init__(self, folder: Path | str | Traversable) -> None:
        self.folder: Traversable = Path(folder) if isinstance(folder, str | Path) else folder
        self._loaded: dict[str, dict[str, Statement]] = {}

    @classmethod
    def beside(cls, module_file: str, name: str = "sql") -> SqlFolder:
        """The folder ``name`` next to a module: ``SqlFolder.beside(__file__)``."""
        return cls(Path(module_file).resolve().parent / name)

    def statements(self, dialect: str) -> dict[str, Statement]:
        """Every named statement of ``dialect``."""
        loaded = self._loaded.get(dialect)
        if loaded is None:
            loaded = {}
            for sub in ("common", dialect):
                own: dict[str, Statement] = {}
                directory = self.folder.joinpath(sub)
                if not directory.is_dir():
                    continue
                for entry in sorted(directory.iterdir(), key=lambda e: e.name):
                    if entry.name.endswith(".sql"):
                        for name, statement in parse(entry.read_text(encoding="utf-8")).items():
                            if name in own:
                                raise ValueError(f"query {name} defined twice in {sub}/")
                            own[name] = statement
                loaded.update(own)
            self._loaded[dialect] = loaded
        return loaded

    def text(self, dialect: str, name: str) -> str:
        """The SQL of ``name`` for ``dialect``."""
        try:
            return self.statements(dialect)[name].text
        except KeyError:
            raise LookupError(f"no query {name!r} for {dialect} in {self.folder}") from None

    def migration_steps(self, dialect: str) -> list[Statement]:
        """The schema steps (``migrate_*``) of ``dialect`` in name order, each guarded."""
        steps = [s for n, s in sorted(self.statements(dialect).items()) if n.startswith("migrate_")]
        for step in steps:
            if not step.unless:
                raise ValueError(f"migration step {step.name} has no -- unless: guard")
        return steps


BATCHRUN_SQL = SqlFolder(resources.files("batchrun").joinpath("sql"))
PLACEHOLDERS = {"mysql": "%s", "sqlite": "?", "postgresql": "$n"}


@cache
def load(dialect: str) -> Queries:
    """batchrun's own named queries for ``dialect``, shipped inside the package."""
    statements = BATCHRUN_SQL.statements(dialect)
    return Queries(dialect=dialect, placeholder=PLACEHOLDERS[dialect], statements=statements)


def migration_steps(dialect: str) -> Sequence[Statement]:
    """batchrun's own schema steps of ``dialect`` in order (queries named ``migrate_NNNN_*``)."""
    return BATCHRUN_SQL.migration_steps(dialect)

"""The temporary database a harness runs a job on, and the test's own schema SQL.

By default a SQLite file in a new temporary folder, removed afterwards. Any URL works: a
server URL that names no database (``mysql://root@127.0.0.1:3306/``,
``postgresql://postgres@127.0.0.1:5432/``) gets a new database of its own, dropped
afterwards; a URL that names one is used as it is and left in place.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from batchrun.db import connect
from batchrun.db.base import Database, JobDatabase
from batchrun.db.sql import SqlFolder
from batchrun.errors import ConfigError
from batchrun.urls import scheme_of

# The schema SQL a test gives: one script, a list of statements, or either per dialect.
Schema = str | Sequence[str] | Mapping[str, str | Sequence[str]]

_SQL = SqlFolder(Path(__file__).resolve().parent / "sql")
_SERVER_DIALECTS = {
    "mysql": "mysql",
    "mariadb": "mysql",
    "mysql+aiomysql": "mysql",
    "postgresql": "postgresql",
    "postgres": "postgresql",
}
# The database a server always has, to create and drop the test's own from.
_MAINTENANCE = {"mysql": "information_schema", "postgresql": "postgres"}


class TemporaryDatabase:
    """Where the harness's database lives, and how it goes away (``remove``)."""

    def __init__(self, url: str, *, folder: Path | None = None, created: str | None = None):
        self.url = url
        self._folder = folder  # a temporary folder holding the SQLite file
        self._created = created  # the name of a database made on a server for this test
        self._server_url = url

    @classmethod
    async def make(cls, url: str | None) -> TemporaryDatabase:
        """A database at ``url`` (see the module docstring); None: a temporary SQLite file."""
        if url is None:
            folder = Path(tempfile.mkdtemp(prefix="batchrun-test-"))
            return cls(f"sqlite:///{folder / 'test.db'}", folder=folder)
        dialect = _SERVER_DIALECTS.get(scheme_of(url))
        parts = urlsplit(url)
        if dialect is None or parts.path.strip("/"):
            return cls(url)
        name = f"batchrun_test_{uuid.uuid4().hex[:12]}"
        await _statement(url, dialect, "create_database", name)
        made = cls(urlunsplit(parts._replace(path=f"/{name}")), created=name)
        made._server_url = url
        return made

    async def remove(self) -> None:
        """Drop the database made for the test, or remove the SQLite file's folder."""
        if self._created is not None:
            dialect = _SERVER_DIALECTS[scheme_of(self._server_url)]
            await _statement(self._server_url, dialect, "drop_database", self._created)
            self._created = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


async def _statement(server_url: str, dialect: str, name: str, database: str) -> None:
    """Run ``name`` (create or drop ``database``) from the server's maintenance database."""
    assert re.fullmatch(r"batchrun_test_[0-9a-f]{12}", database)  # never a name from outside
    parts = urlsplit(server_url)
    url = urlunsplit(parts._replace(path=f"/{_MAINTENANCE[dialect]}"))
    db = await connect(url, pool_size=1)
    try:
        await JobDatabase(db).execute(_SQL.text(dialect, name).format(name=database))
    finally:
        await db.close()


def statements(schema: Schema, dialect: str) -> list[str]:
    """The statements of a test's schema for ``dialect``.

    A mapping holds one entry per dialect (``"sqlite"``, ``"mysql"``, ``"postgresql"``);
    a string is split at each ``;`` that ends a statement (outside quotes and comments);
    a list is taken as it is, one statement each.
    """
    if isinstance(schema, Mapping):
        if dialect not in schema:
            raise ConfigError(
                f"the test's schema has no SQL for {dialect} (it has: {', '.join(schema)})"
            )
        schema = schema[dialect]
    if isinstance(schema, str):
        return split_statements(schema)
    return [s for s in schema if s.strip()]


# Quoted strings, quoted names and comments, whose ';' ends nothing; or a ';'.
_PIECE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|--[^\n]*|/\*.*?\*/|;", re.S)


def split_statements(script: str) -> list[str]:
    """``script`` cut into statements at each ``;`` outside quotes and comments."""
    found: list[str] = []
    start = 0
    for match in _PIECE.finditer(script):
        if match.group() == ";":
            found.append(script[start : match.start()])
            start = match.end()
    found.append(script[start:])
    return [s.strip() for s in found if _code(s)]


def _code(statement: str) -> bool:
    """Whether ``statement`` holds more than comments and whitespace."""
    without = re.sub(r"--[^\n]*|/\*.*?\*/", "", statement, flags=re.S)
    return bool(without.strip())


async def run_schema(db: Database, schema: Schema) -> None:
    """Create the test's tables: each statement of ``schema``, in order."""
    job_db = JobDatabase(db)
    for statement in statements(schema, db.dialect):
        await job_db.execute(statement)


__all__ = ["Schema", "TemporaryDatabase", "run_schema", "split_statements", "statements"]

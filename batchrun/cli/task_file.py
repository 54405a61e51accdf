"""The tasks ``batchrun submit JOB`` is given: its ``--id``s (with ``--data`` and ``--key``),
or a file of JSON Lines (``--file``), each checked before anything is queued."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from batchrun.db.store import MAX_ID
from batchrun.errors import UsageError
from batchrun.task import BadTask, checked

FIELDS = ("entity_id", "data", "key")

Submission = tuple[int, Any, str | None]  # (entity id, data, key), as submit_many takes them


class TaskFile(list[Submission]):
    """The tasks of a ``--file``, with where each key is: ``where(key)``."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.key_line: dict[str, int] = {}

    def where(self, key: str | None) -> str | None:
        """``--file NAME line N`` of the line that gives ``key``, if one does."""
        line = self.key_line.get(key) if key is not None else None
        return None if line is None else f"--file {self.name} line {line}"


def from_options(ids: list[int], data: str | None, key: str | None) -> list[Submission]:
    """One task per ``--id``, all with the same ``--data``; ``--key`` names one task."""
    if key is not None and len(ids) > 1:
        raise UsageError("--key names one task: give one --id with it")
    if data is not None and data.startswith("@"):  # @FILE: the JSON in a file
        try:
            data = Path(data[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--data {data}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise UsageError(f"--data {data}: not UTF-8 (byte {exc.start})") from None
    try:
        parsed: Any = None if data is None else json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--data is not JSON: {exc}") from None
    tasks = [(entity, parsed, key) for entity in ids]
    for task in tasks:
        try:
            checked(*task)
        except BadTask as exc:
            raise UsageError(str(exc)) from None
    return tasks


def from_file(name: str) -> TaskFile:
    """The tasks of a JSON Lines file (``-``: standard input), one object a line:
    ``{"entity_id": 7, "data": {...}, "key": "..."}``, ``data`` and ``key`` optional,
    blank lines skipped, a byte order mark and CRLF line ends allowed. A bad line, or a
    key on two lines, is refused with its line number before anything is queued."""
    try:
        if name == "-":
            if sys.stdin is None:
                raise UsageError("--file -: there is no standard input")
            raw = sys.stdin.buffer.read()
        else:
            raw = Path(name).read_bytes()
        text = raw.decode("utf-8-sig")
    except OSError as exc:
        raise UsageError(f"--file {name}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--file {name}: not UTF-8 text (byte {exc.start})") from None
    tasks = TaskFile(name)
    key_line = tasks.key_line
    # Lines end at LF alone: U+2028 and the like may stand unescaped in a JSON string.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"--file {name} line {number}"
        task = _task(line.removesuffix("\r"), where)
        key = task[2]
        if key is not None:
            if key in key_line:
                raise UsageError(f"{where}: key {key!r} is on line {key_line[key]} already")
            key_line[key] = number
        tasks.append(task)
    return tasks


def _task(line: str, where: str) -> Submission:
    try:
        fields: Any = json.loads(line, object_pairs_hook=_no_repeated_field)
    except _Repeated as exc:
        raise UsageError(f"{where}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise UsageError(f"{where}: not a JSON object")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})")
    if "entity_id" not in fields:
        raise UsageError(f"{where}: no entity_id")
    entity = fields["entity_id"]
    if type(entity) is not int:  # bool is an int to Python, not to JSON
        raise UsageError(f"{where}: entity_id is not an integer: {json.dumps(entity)[:40]}")
    if not 0 < entity <= MAX_ID:
        raise UsageError(f"{where}: entity_id is out of range (1 to {MAX_ID})")
    task = (entity, fields.get("data"), fields.get("key"))
    try:
        checked(*task)
    except BadTask as exc:
        raise UsageError(f"{where}: {exc}") from None
    return task


class _Repeated(ValueError):
    """A field given twice in one object (JSON would keep the last without a word)."""


def _no_repeated_field(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, value in pairs:
        if name in fields:
            raise _Repeated(f"field {name!r} is given twice")
        fields[name] = value
    return fields

"""The tasks ``batchrun submit JOB`` is given: its ``--id``s (with ``--data`` and ``--key``),
or a file of JSON Lines (``--file``), each checked before anything is queued."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from batchrun.errors import UsageError
from batchrun.task import BadTask, checked

FIELDS = ("entity_id", "data", "key")

Submission = tuple[int, Any, str | None]  # (entity id, data, key), as submit_many takes them


def from_options(ids: list[int], data: str | None, key: str | None) -> list[Submission]:
    """One task per ``--id``, all with the same ``--data``; ``--key`` names one task."""
    if key is not None and len(ids) > 1:
        raise UsageError("--key names one task: give one --id with it")
    if data is not None and data.startswith("@"):  # @FILE: the JSON in a file
        try:
            data = Path(data[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--data {data}: {exc.strerror}") from None
    try:
        parsed: Any = None if data is None else json.loads(data)
    except ValueError as exc:
        raise UsageError(f"--data is not JSON: {exc}") from None
    tasks = [(entity, parsed, key) for entity in ids]
    for task in tasks:
        try:
            checked(*task)
        except BadTask as exc:
            raise UsageError(str(exc)) from None
    return tasks


def from_file(name: str) -> list[Submission]:
    """The tasks of a JSON Lines file (``-``: standard input), one object a line:
    ``{"entity_id": 7, "data": {...}, "key": "..."}``, ``data`` and ``key`` optional,
    blank lines skipped. A bad line is refused with its number, before anything is queued."""
    try:
        if name == "-":
            text = sys.stdin.buffer.read().decode("utf-8")
        else:
            text = Path(name).read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"--file {name}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--file {name}: not UTF-8 text (byte {exc.start})") from None
    tasks: list[Submission] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            tasks.append(_task(line, f"--file {name} line {number}"))
    return tasks


def _task(line: str, where: str) -> Submission:
    try:
        fields: Any = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"{where}: not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise UsageError(f"{where}: not a JSON object")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})")
    if "entity_id" not in fields:
        raise UsageError(f"{where}: no entity_id")
    task = (fields["entity_id"], fields.get("data"), fields.get("key"))
    try:
        checked(*task)
    except BadTask as exc:
        raise UsageError(f"{where}: {exc}") from None
    return task

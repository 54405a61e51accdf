"""The steps of an entity's story (control/story.py, control/task_story.py): each an
``Event`` at a time in epoch milliseconds, shown as ISO 8601 UTC."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Event:
    """One step of the story: when (epoch ms), what, the detail, and the run that did it.

    ``current``: a fact of the moment the story is told (a message's state now), which no
    run did; not in the JSON.
    """

    at: int
    what: str
    detail: str = ""
    run_id: int | None = None
    current: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "at": iso(self.at),
            "what": self.what,
            "detail": self.detail,
            "run_id": self.run_id,
        }


def iso(ms: int) -> str:
    """Epoch milliseconds as an ISO 8601 UTC time, to the millisecond."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

"""How one entity stands in batchrun's ledger for a period: what a test asserts after a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from batchrun.db.store import State

StateName = Literal["pending", "succeeded", "skipped", "retrying", "failed"]

STATE_NAMES: dict[State, StateName] = {
    State.PENDING: "pending",
    State.SUCCEEDED: "succeeded",
    State.SKIPPED: "skipped",
    State.RETRYING: "retrying",
    State.FAILED: "failed",
}


@dataclass(frozen=True)
class LedgerEntry:
    """One entity's row in the ledger for a (job, ``once_per`` period).

    Attributes:
        state: ``"succeeded"`` (done), ``"skipped"`` (ended for good without failure),
            ``"retrying"`` (failed temporarily, waiting in the retry queue), ``"failed"``
            (failed for good, dead-lettered) or ``"pending"`` (claimed, not finished).
        attempts: how many times the entity was worked on.
        reason: why it was skipped or failed (the ``Skip`` / ``Retry`` / ``Fail`` reason,
            or the mail server's answer); None once it succeeded.
    """

    state: StateName
    attempts: int
    reason: str | None

    @property
    def done(self) -> bool:
        """Whether the entity is finished for the period (succeeded, skipped or failed)."""
        return self.state in ("succeeded", "skipped", "failed")


__all__ = ["STATE_NAMES", "LedgerEntry", "StateName"]

"""``batchrun prune``: the run history and the ended submitted tasks older than a cutoff,
deleted in batches of ``BATCH`` rows (a short statement each, read in id order from where
the last one stopped), so a production database never holds a long lock for it.

What is kept: a run whose process is alive, and every task not ended (pending, running,
or failed and waiting for its retry). A task's row is what makes its key a no-op when
submitted again: a key pruned and then submitted again runs again. The ledger is never
pruned (it is what keeps an entity done once per period), nor the suppression list.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchrun.db.base import Database

BATCH = 1000  # rows a statement


@dataclass(frozen=True, slots=True)
class Pruned:
    """How many rows were deleted (or, in a dry run, would be)."""

    runs: int
    tasks: int


async def prune(
    db: Database,
    *,
    runs_before: int | None,
    tasks_before: int | None,
    dry_run: bool = False,
    lease_s: float = 60.0,
) -> Pruned:
    """Delete the run rows over before ``runs_before`` and the tasks ended before
    ``tasks_before`` (epoch ms; None: none of them). A run whose heartbeat is within
    ``lease_s`` is alive, whatever the cutoff; each job's newest run of each kind and
    outcome is kept."""
    stale = {"stale": await db.clock_ms() - int(lease_s * 2000)}  # heartbeats' clock
    runs = 0 if runs_before is None else await _prune(db, "runs", runs_before, dry_run, stale)
    tasks = 0 if tasks_before is None else await _prune(db, "tasks", tasks_before, dry_run, {})
    return Pruned(runs, tasks)


async def _prune(db: Database, what: str, before: int, dry_run: bool, extra: dict[str, int]) -> int:
    deleted, after = 0, 0
    while True:
        args = {"after": after, "before": before, "batch": BATCH, **extra}
        if what == "runs":
            rows = await db.fetchall("prune_runs_next", **args)
        else:
            rows = await db.fetchall("prune_tasks_next", **args)
        ids = [int(r[0]) for r in rows]
        if not ids:
            return deleted
        if dry_run:
            deleted += len(ids)
        elif what == "runs":
            deleted += await db.execute("prune_runs_delete", ids=ids)
        else:
            deleted += await db.execute("prune_tasks_delete", ids=ids)
        after = ids[-1]

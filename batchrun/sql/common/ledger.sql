-- The ledger: one row per (job, once_key, entity_id), where once_key is the job's once_per
-- period ('2025', '2025-06', '2025-06-01'). state: 0 pending/claimed, 1 succeeded (sent),
-- 2 skipped, 3 failed temporarily (retrying), 4 failed for good. owner/lease_until (epoch
-- ms) is the claim that serializes work on one entity; queued = 1 while a retry message
-- for the entity waits on the queue (one per entity).

-- name: claims_of
SELECT entity_id, state, owner, lease_until, attempts, queued FROM batchrun_ledger
WHERE job = :job AND once_key = :once AND entity_id IN :ids;

-- name: claim_expired
-- Takes over claims whose owner died (lease expired) or let go. The WHERE is re-checked
-- on the locked row (InnoDB) or under the one writer (SQLite), so two runs never both win.
-- run_id: the run taking them over (`batchrun why`), when it has a history row.
UPDATE batchrun_ledger
SET owner = :me, lease_until = :until, updated_at = :now, run_id = COALESCE(:run, run_id)
WHERE job = :job AND once_key = :once AND entity_id IN :ids
  AND state IN (0, 3) AND (owner IS NULL OR lease_until < :now);

-- name: finish
UPDATE batchrun_ledger
SET state = :state, owner = NULL, lease_until = NULL, last_error = :error,
    attempts = attempts + 1, queued = :queued, updated_at = :now
WHERE job = :job AND once_key = :once AND entity_id IN :ids AND owner = :me;

-- name: release
UPDATE batchrun_ledger SET owner = NULL, lease_until = NULL, updated_at = :now
WHERE job = :job AND once_key = :once AND entity_id IN :ids AND owner = :me;

-- name: heartbeat
-- A primary-key range around the rows this run holds: it reads those pages only, not the
-- owner index (whose purged-but-not-yet-removed entries grow with the run).
UPDATE batchrun_ledger SET lease_until = :until
WHERE job = :job AND once_key = :once AND entity_id BETWEEN :lo AND :hi AND owner = :me;

-- name: period_started
SELECT 1 FROM batchrun_ledger WHERE job = :job AND period = :period LIMIT 1;

-- name: unqueued_failures
SELECT job, once_key, period, entity_id, attempts, last_error FROM batchrun_ledger
WHERE state = 3 AND queued = 0 AND owner IS NULL
LIMIT :limit;

-- name: mark_queued
UPDATE batchrun_ledger SET queued = 1
WHERE job = :job AND once_key = :once AND entity_id IN :ids AND state = 3;

-- name: status_counts
SELECT
  COALESCE(SUM(CASE WHEN state = 1 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 2 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 3 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 4 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 0 THEN 1 ELSE 0 END), 0)
FROM batchrun_ledger
WHERE job = :job AND period = :period;

-- name: status_problems
SELECT entity_id, state, attempts, last_error FROM batchrun_ledger
WHERE job = :job AND period = :period AND state IN (2, 3, 4)
ORDER BY entity_id
LIMIT :limit;

-- name: ledger_entry
-- One entity's row for a (job, once_per period): how it stands (batchrun.testing reads it).
SELECT state, attempts, last_error FROM batchrun_ledger
WHERE job = :job AND once_key = :once AND entity_id = :id;

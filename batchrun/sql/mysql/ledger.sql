-- name: claim_new
-- INSERT IGNORE on the ledger's primary key: a row another run inserted first stays its.
INSERT IGNORE INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, updated_at)
VALUES :rows;

-- name: finish
-- FORCE INDEX: without it MariaDB plans this over the owner index, reading every row the
-- run holds (and the index's purged-but-not-removed entries) for each page it finishes:
-- 3 rows examined per user against 1 on the primary key (make bench, rows_by_statement).
UPDATE batchrun_ledger FORCE INDEX (PRIMARY)
SET state = :state, owner = NULL, lease_until = NULL, last_error = :error,
    attempts = attempts + 1, queued = :queued, updated_at = :now
WHERE job = :job AND once_key = :once AND entity_id IN :ids AND owner = :me;

-- name: release
-- FORCE INDEX: as finish.
UPDATE batchrun_ledger FORCE INDEX (PRIMARY)
SET owner = NULL, lease_until = NULL, updated_at = :now
WHERE job = :job AND once_key = :once AND entity_id IN :ids AND owner = :me;

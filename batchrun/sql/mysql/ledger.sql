-- name: claim_new
-- INSERT IGNORE on the ledger's primary key: a row another run inserted first stays its.
INSERT IGNORE INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, updated_at,
   run_id)
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

-- name: clock_ms
-- The server's clock in epoch milliseconds: leases are set and compared on it, so hosts
-- whose clocks differ agree on when a claim expires. UTC_TIMESTAMP(6) is NOW(6) in UTC
-- (no session time zone, no daylight-saving fold).
SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000;

-- name: claim_new
-- INSERT OR IGNORE on the ledger's primary key: a row another run inserted first stays its.
INSERT OR IGNORE INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, updated_at,
   run_id)
VALUES :rows;

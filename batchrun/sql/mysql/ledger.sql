-- name: claim_new
-- INSERT IGNORE on the ledger's primary key: a row another run inserted first stays its.
INSERT IGNORE INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, updated_at)
VALUES :rows;

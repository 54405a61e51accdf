-- name: claim_new
-- ON CONFLICT DO NOTHING on the ledger's primary key: a row another run inserted first
-- stays its.
INSERT INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, updated_at)
VALUES :rows
ON CONFLICT DO NOTHING;

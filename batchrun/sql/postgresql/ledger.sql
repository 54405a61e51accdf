-- name: claim_new
-- ON CONFLICT DO NOTHING on the ledger's primary key: a row another run inserted first
-- stays its.
INSERT INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, updated_at,
   run_id)
VALUES :rows
ON CONFLICT DO NOTHING;

-- name: analyze_ledger
-- Run by the adapter as a run's claims pile up (after 1,000, 2,000, 4,000 ... new rows):
-- until the ledger's statistics know a new once_key ('2026' on the year's first run), the
-- planner takes it for a handful of rows and reads the whole (job, once_key) range of the
-- primary key for every finish, release and claims_of instead of looking each id up.
ANALYZE batchrun_ledger;

-- name: clock_ms
-- The server's clock in epoch milliseconds: leases are set and compared on it, so hosts
-- whose clocks differ agree on when a claim expires. clock_timestamp(), not now(): the
-- time of this statement, not of a transaction's start.
SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint;

-- Slots of shared backends (batchrun_backend_slot): one row per (backend, slot), held by
-- one owner at a time under a lease on the database server's clock (:now, :until are its
-- epoch milliseconds). Each dialect's backends.sql holds the insert that ignores a slot
-- already there.

-- name: slot_free
-- The slots of the first :slots a new owner may take: free, or their lease over.
SELECT slot FROM batchrun_backend_slot
WHERE backend = :backend AND slot < :slots AND (owner IS NULL OR lease_until < :now)
ORDER BY slot;

-- name: slot_take
UPDATE batchrun_backend_slot SET owner = :me, lease_until = :until
WHERE backend = :backend AND slot = :slot AND (owner IS NULL OR lease_until < :now);

-- name: slot_extend
-- Fenced: a slot another owner took over (this one's lease ran out) is not renewed.
UPDATE batchrun_backend_slot SET lease_until = :until
WHERE backend = :backend AND slot = :slot AND owner = :me;

-- name: slot_release
UPDATE batchrun_backend_slot SET owner = NULL, lease_until = 0
WHERE backend = :backend AND slot = :slot AND owner = :me;

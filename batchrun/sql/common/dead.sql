-- Dead letters of the local queue (batchrun_queue rows with dead = 1): list, redrive,
-- purge; and the ledger rows a redrive revives (failed for good -> retrying, attempts
-- from zero), so the consumer works the entity again instead of finding it finished.

-- name: dead_list
SELECT id, body, receive_count, dead_reason, created_at FROM batchrun_queue
WHERE dead = 1 AND id > :after
ORDER BY id LIMIT :limit;

-- name: dead_by_ids
SELECT id, body, receive_count, dead_reason, created_at FROM batchrun_queue
WHERE dead = 1 AND id IN :ids*
ORDER BY id;

-- name: dead_redrive
UPDATE batchrun_queue
SET dead = 0, dead_reason = NULL, receipt = NULL, receive_count = 0, visible_at = :now
WHERE dead = 1 AND id IN :ids*;

-- name: dead_purge
DELETE FROM batchrun_queue WHERE dead = 1;

-- name: ledger_revive
UPDATE batchrun_ledger
SET state = 3, attempts = 0, queued = 1, owner = NULL, lease_until = NULL, updated_at = :now
WHERE job = :job AND period = :period AND entity_id IN :ids* AND state = 4;

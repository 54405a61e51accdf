-- name: claim_new
INSERT OR IGNORE INTO batchrun_task
  (job, year, user_id, month, state, attempts, owner, lease_until, queued, updated_at)
VALUES :rows*;

-- name: claim_expired
-- Takes over claims whose owner died (lease expired) or let go; SQLite runs one writer
-- at a time, so two runs can never both win one user.
UPDATE batchrun_task SET owner = :me, lease_until = :until, updated_at = :now
WHERE job = :job AND year = :year AND user_id IN :ids*
  AND state IN (0, 3) AND (owner IS NULL OR lease_until < :now);

-- name: claims_of
SELECT user_id, state, owner, lease_until FROM batchrun_task
WHERE job = :job AND year = :year AND user_id IN :ids*;

-- name: finish
UPDATE batchrun_task
SET state = :state, owner = NULL, lease_until = NULL, last_error = :error,
    attempts = attempts + 1, queued = :queued, updated_at = :now
WHERE job = :job AND year = :year AND user_id IN :ids* AND owner = :me;

-- name: release
UPDATE batchrun_task SET owner = NULL, lease_until = NULL, updated_at = :now
WHERE job = :job AND year = :year AND user_id IN :ids* AND owner = :me;

-- name: heartbeat
-- A primary-key range around the rows this run holds: it reads those pages only, not the
-- owner index (whose purged-but-not-yet-removed entries grow with the run).
UPDATE batchrun_task SET lease_until = :until
WHERE job = :job AND year = :year AND user_id BETWEEN :lo AND :hi AND owner = :me;

-- name: month_started
SELECT 1 FROM batchrun_task WHERE job = :job AND year = :year AND month = :month LIMIT 1;

-- name: unqueued_failures
SELECT job, year, month, user_id, attempts, last_error FROM batchrun_task
WHERE state = 3 AND queued = 0 AND owner IS NULL
LIMIT :limit;

-- name: mark_queued
UPDATE batchrun_task SET queued = 1
WHERE job = :job AND year = :year AND user_id IN :ids* AND state = 3;

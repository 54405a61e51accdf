-- name: prune_runs_next
-- The next :batch run rows over before :before (ended then, or crashed: no heartbeat
-- since), after id :after in id order (control/prune.py deletes them by id). A running
-- process's row is never among them.
SELECT id FROM batchrun_run
WHERE id > :after AND COALESCE(ended_at, heartbeat_at) < :before
  AND (outcome <> 'running' OR heartbeat_at < :before)
ORDER BY id
LIMIT :batch;

-- name: prune_runs_delete
DELETE FROM batchrun_run WHERE id IN :ids*;

-- name: prune_tasks_next
-- The next :batch submitted tasks that ended (succeeded or dead) before :before, after id
-- :after in id order; a pending, running or failed one (waiting for a retry) is kept.
SELECT id FROM batchrun_entity_task
WHERE id > :after AND state IN (2, 4) AND finished_at < :before
ORDER BY id
LIMIT :batch;

-- name: prune_tasks_delete
-- Only what still ended before :before (a row is never started again once it ended).
DELETE FROM batchrun_entity_task WHERE id IN :ids* AND state IN (2, 4);

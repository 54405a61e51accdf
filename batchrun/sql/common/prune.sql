-- name: prune_runs_next
-- The next :batch run rows over before :before (ended then, or crashed: no heartbeat
-- since), after id :after in id order (control/prune.py deletes them by id). A running
-- process's row is never among them.
-- Each job's (and kind's) newest row of each outcome is kept, so `status` and the
-- metrics' last-success time still say when it last ran, however long ago; and its
-- newest of each outcome that did something: a run that found its job paused is no
-- success to the metrics (metrics_last_runs), so the real one before it stays too.
SELECT id FROM batchrun_run
WHERE id > :after AND COALESCE(ended_at, heartbeat_at) < :before
  AND (outcome <> 'running' OR heartbeat_at < :stale)
  AND id NOT IN (SELECT MAX(id) FROM batchrun_run GROUP BY job, kind, outcome)
  AND id NOT IN (
    SELECT MAX(id) FROM batchrun_run
    WHERE counts IS NULL OR counts NOT LIKE '%"paused":true%'
    GROUP BY job, kind, outcome
  )
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
-- An ended task (succeeded or dead) never starts again.
DELETE FROM batchrun_entity_task WHERE id IN :ids* AND state IN (2, 4);

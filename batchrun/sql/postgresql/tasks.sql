-- name: task_insert
-- A key already submitted is left as it is (the submission is a no-op).
INSERT INTO batchrun_entity_task (job, task_key, entity_id, data, state, attempts, created_at)
VALUES (:job, :key, :entity_id, :data, 0, 0, :now)
ON CONFLICT (job, task_key) DO NOTHING;

-- name: task_withdraw
-- Submissions whose messages could not be sent, taken back in one statement while no
-- process has started them, so that the same keys can be submitted again.
DELETE FROM batchrun_entity_task
WHERE job = :job AND task_key IN :keys* AND state = 0 AND attempts = 0;

-- name: turn_insert
-- The turn rows of a submission's entities, where there are none yet.
INSERT INTO batchrun_entity_turn (job, entity_id, owner, lease_until)
VALUES :rows
ON CONFLICT (job, entity_id) DO NOTHING;

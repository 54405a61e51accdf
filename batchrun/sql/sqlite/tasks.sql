-- name: task_insert
-- A key already submitted is left as it is (the submission is a no-op).
INSERT INTO batchrun_entity_task (job, task_key, entity_id, data, state, attempts, created_at)
VALUES (:job, :key, :entity_id, :data, 0, 0, :now)
ON CONFLICT (job, task_key) DO NOTHING;

-- name: turn_insert
INSERT INTO batchrun_entity_turn (job, entity_id, owner, lease_until)
VALUES (:job, :entity_id, NULL, 0)
ON CONFLICT (job, entity_id) DO NOTHING;

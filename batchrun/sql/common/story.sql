-- One entity's story (batchrun why, the dashboard's entity page): its ledger row and the
-- local queue's messages that may name it. The queue's bodies are JSON; the LIKE patterns
-- only narrow the scan (a superset), the caller parses each body to be sure.

-- name: story_ledger
SELECT period, state, attempts, owner, lease_until, queued, last_error, updated_at, mail_event,
  run_id
FROM batchrun_ledger
WHERE job = :job AND once_key = :once AND entity_id = :id;

-- name: story_queue
SELECT id, body, visible_at, receive_count, dead, dead_reason, created_at
FROM batchrun_queue
WHERE body LIKE :job_like AND body LIKE :id_like
ORDER BY id
LIMIT :limit;

-- name: story_tasks
-- A task job's entity: its newest submitted tasks (control/task_story.py).
SELECT id, task_key, state, attempts, owner, lease_until, last_error, created_at,
  started_at, finished_at, retry_at, resent_at, run_id
FROM batchrun_entity_task
WHERE job = :job AND entity_id = :id
ORDER BY id DESC
LIMIT :limit;

-- name: story_task_current
-- Its oldest unfinished task: the one whose turn it is, which may be older than the
-- newest story_tasks reads.
SELECT id, task_key, state, attempts, owner, lease_until, last_error, created_at,
  started_at, finished_at, retry_at, resent_at, run_id
FROM batchrun_entity_task
WHERE job = :job AND entity_id = :id AND state IN (0, 1, 3)
ORDER BY id
LIMIT 1;

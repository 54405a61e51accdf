-- The dashboard (batchrun ui): a job's periods with their counts, and the local queue's
-- messages waiting (queue/dead.py lists and redrives the dead).

-- name: ui_job_periods
-- The (job, period, state) index covers it.
SELECT period, state, COUNT(*) FROM batchrun_ledger
WHERE job = :job
GROUP BY period, state
ORDER BY period DESC, state;

-- name: ui_queue_waiting
SELECT id, body, visible_at, receive_count, created_at FROM batchrun_queue
WHERE dead = 0
ORDER BY id
LIMIT :limit;

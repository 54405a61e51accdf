-- The dashboard (batchrun ui): a job's periods with their counts, and the local queue's
-- messages, waiting or dead, with redrive.

-- name: ui_job_periods
-- The (job, period, state) index covers it.
SELECT period, state, COUNT(*) FROM batchrun_ledger
WHERE job = :job
GROUP BY period, state
ORDER BY period DESC, state;

-- name: ui_queue_messages
SELECT id, body, visible_at, receive_count, dead, dead_reason, created_at FROM batchrun_queue
WHERE dead = :dead
ORDER BY id
LIMIT :limit;

-- name: ui_redrive
-- A dead letter back on the queue, visible now, as if never received.
UPDATE batchrun_queue
SET dead = 0, dead_reason = NULL, receive_count = 0, receipt = NULL, visible_at = :now
WHERE id IN :ids AND dead = 1;

-- The local retry queue (batchrun_queue), with SQS semantics: the statements every dialect
-- shares; each dialect's queue.sql holds its own queue_receive.

-- name: queue_send
INSERT INTO batchrun_queue (body, visible_at, receive_count, dead, dead_reason, created_at)
VALUES :rows*;

-- name: queue_received
SELECT id, body, receive_count FROM batchrun_queue WHERE receipt = :receipt ORDER BY id;

-- name: queue_delete
DELETE FROM batchrun_queue WHERE id IN :ids*;

-- name: queue_change_visibility
UPDATE batchrun_queue SET visible_at = :visible_at WHERE id = :id;

-- name: queue_give_back
-- Back for a later delivery as if new (its backend was busy): a new body, its receives
-- counted afresh.
UPDATE batchrun_queue SET body = :body, visible_at = :visible_at, receive_count = 0
WHERE id = :id;

-- name: queue_dead_letter
-- A dead row's visible_at is when it died (no receive reads a dead row): `why` tells the
-- step then, with the run that did it, not at the time the message was first queued.
UPDATE batchrun_queue SET dead = 1, dead_reason = :reason, visible_at = :now WHERE id = :id;

-- name: queue_depths
SELECT
  COALESCE(SUM(CASE WHEN dead = 0 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN dead = 1 THEN 1 ELSE 0 END), 0)
FROM batchrun_queue;

-- name: queue_next_visible
-- When (ms, the server's clock) the next live message becomes visible; NULL when none.
SELECT MIN(visible_at) FROM batchrun_queue WHERE dead = 0;

-- name: queue_dead_letters
SELECT id, body, receive_count, dead_reason FROM batchrun_queue
WHERE dead = 1 ORDER BY id LIMIT :limit;

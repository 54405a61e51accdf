-- name: queue_send
INSERT INTO batchrun_queue (body, visible_at, receive_count, dead, dead_reason, created_at)
VALUES :rows*;

-- name: queue_receive
-- One statement marks the batch with a fresh receipt, so two consumers never receive the
-- same message while it is invisible.
UPDATE batchrun_queue
SET receipt = :receipt, visible_at = :until, receive_count = receive_count + 1
WHERE dead = 0 AND visible_at <= :now
ORDER BY visible_at, id
LIMIT :limit;

-- name: queue_received
SELECT id, body, receive_count FROM batchrun_queue WHERE receipt = :receipt ORDER BY id;

-- name: queue_delete
DELETE FROM batchrun_queue WHERE id IN :ids*;

-- name: queue_change_visibility
UPDATE batchrun_queue SET visible_at = :visible_at WHERE id = :id;

-- name: queue_dead_letter
UPDATE batchrun_queue SET dead = 1, dead_reason = :reason WHERE id = :id;

-- name: queue_depths
SELECT
  COALESCE(SUM(CASE WHEN dead = 0 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN dead = 1 THEN 1 ELSE 0 END), 0)
FROM batchrun_queue;

-- name: queue_dead_letters
SELECT id, body, receive_count, dead_reason FROM batchrun_queue
WHERE dead = 1 ORDER BY id LIMIT :limit;

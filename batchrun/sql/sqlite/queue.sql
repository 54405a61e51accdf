-- name: queue_receive
-- One statement marks the batch with a fresh receipt, so two consumers never receive the
-- same message while it is invisible.
UPDATE batchrun_queue
SET receipt = :receipt, visible_at = :until, receive_count = receive_count + 1
WHERE id IN (
  SELECT id FROM batchrun_queue WHERE dead = 0 AND visible_at <= :now
  ORDER BY visible_at, id LIMIT :limit
);

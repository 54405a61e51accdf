-- name: suppression_add
-- The first reason stays: a later unsubscribe does not hide an earlier complaint.
INSERT INTO batchrun_suppression (address, reason, source, created_at)
VALUES (:address, :reason, :source, :now)
ON CONFLICT DO NOTHING;

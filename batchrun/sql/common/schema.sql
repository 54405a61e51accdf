-- name: schema_has_step
SELECT 1 FROM batchrun_schema WHERE step = :step;

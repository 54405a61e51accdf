-- batchrun metrics (Prometheus): the ledger's entities by job, period and state. The
-- (job, period, state) index covers it.

-- name: metrics_entities
SELECT job, period, state, COUNT(*) FROM batchrun_ledger
GROUP BY job, period, state
ORDER BY job, period, state;

-- batchrun metrics (Prometheus): the ledger's entities by job, period and state. The
-- (job, period, state) index covers it.

-- name: metrics_entities
SELECT job, period, state, COUNT(*) FROM batchrun_ledger
GROUP BY job, period, state
ORDER BY job, period, state;

-- name: metrics_last_runs
-- Each job's newest run of each outcome that is over: its end (a crashed run's last
-- heartbeat) and its start, epoch ms. A run that found its job paused did nothing (its
-- counts say "paused":true): the job did not run, so it is no last success.
SELECT job, outcome, COALESCE(ended_at, heartbeat_at), started_at FROM batchrun_run
WHERE id IN (
  SELECT MAX(id) FROM batchrun_run
  WHERE job IS NOT NULL AND outcome <> 'running'
    AND (counts IS NULL OR counts NOT LIKE '%"paused":true%')
  GROUP BY job, outcome
)
ORDER BY job, outcome;

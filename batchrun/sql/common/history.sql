-- Run history (batchrun.control.history): one batchrun_run row per run, retry drain,
-- worker process, Lambda invocation and events drain. Times are epoch ms. A row still
-- 'running' whose heartbeat is older than :stale (now less the lease) reads 'crashed':
-- its process died without ending it (kill -9, a lost host, a Lambda timeout).

-- name: run_insert
INSERT INTO batchrun_run
  (job, period, kind, host, pid, version, started_at, heartbeat_at, outcome)
VALUES (:job, :period, :kind, :host, :pid, :version, :now, :now, 'running');

-- name: run_find
-- The row run_insert just wrote (no RETURNING on MySQL): host, pid and start are unique.
SELECT MAX(id) FROM batchrun_run
WHERE host = :host AND pid = :pid AND kind = :kind AND started_at = :now;

-- name: run_beat
UPDATE batchrun_run SET heartbeat_at = :now, counts = :counts
WHERE id = :id AND ended_at IS NULL;

-- name: run_end
UPDATE batchrun_run
SET ended_at = :now, heartbeat_at = :now, exit_code = :exit_code, outcome = :outcome,
    counts = :counts, error = :error
WHERE id = :id;

-- name: run_mark_crashed
-- Marked by the next run: the rows whose process died keep 'crashed' for good.
UPDATE batchrun_run SET outcome = 'crashed'
WHERE outcome = 'running' AND heartbeat_at < :stale;

-- name: runs_all
SELECT id, job, period, kind, host, pid, version, started_at, heartbeat_at, ended_at,
  exit_code,
  CASE WHEN outcome = 'running' AND heartbeat_at < :stale THEN 'crashed' ELSE outcome END,
  counts, error
FROM batchrun_run
WHERE started_at >= :since
ORDER BY id DESC
LIMIT :limit;

-- name: runs_of_job
SELECT id, job, period, kind, host, pid, version, started_at, heartbeat_at, ended_at,
  exit_code,
  CASE WHEN outcome = 'running' AND heartbeat_at < :stale THEN 'crashed' ELSE outcome END,
  counts, error
FROM batchrun_run
WHERE job = :job AND started_at >= :since
ORDER BY id DESC
LIMIT :limit;

-- name: runs_serving_job
-- A task job's runs: its own, and those serving every job's messages (its tasks too).
SELECT id, job, period, kind, host, pid, version, started_at, heartbeat_at, ended_at,
  exit_code,
  CASE WHEN outcome = 'running' AND heartbeat_at < :stale THEN 'crashed' ELSE outcome END,
  counts, error
FROM batchrun_run
WHERE (job = :job OR (job IS NULL AND kind IN ('worker', 'lambda', 'retry')))
  AND started_at >= :since
ORDER BY id DESC
LIMIT :limit;

-- name: run_last_serving_job
-- A task job's newest run that is over (ended, or crashed): its own, or one serving every
-- job's messages; however many run now.
SELECT id, job, period, kind, host, pid, version, started_at, heartbeat_at, ended_at,
  exit_code,
  CASE WHEN outcome = 'running' THEN 'crashed' ELSE outcome END,
  counts, error
FROM batchrun_run
WHERE (job = :job OR (job IS NULL AND kind IN ('worker', 'lambda', 'retry')))
  AND (outcome <> 'running' OR heartbeat_at < :stale)
ORDER BY id DESC
LIMIT 1;

-- name: run_get
SELECT id, job, period, kind, host, pid, version, started_at, heartbeat_at, ended_at,
  exit_code,
  CASE WHEN outcome = 'running' AND heartbeat_at < :stale THEN 'crashed' ELSE outcome END,
  counts, error
FROM batchrun_run
WHERE id = :id;

-- name: runs_running
SELECT id, job, period, kind, host, pid, version, started_at, heartbeat_at, ended_at,
  exit_code, outcome, counts, error
FROM batchrun_run
WHERE outcome = 'running' AND heartbeat_at >= :stale
ORDER BY id DESC;

-- name: runs_last_per_job
-- Each job's newest run that is over (ended, or crashed).
SELECT r.id, r.job, r.period, r.kind, r.host, r.pid, r.version, r.started_at,
  r.heartbeat_at, r.ended_at, r.exit_code,
  CASE WHEN r.outcome = 'running' THEN 'crashed' ELSE r.outcome END,
  r.counts, r.error
FROM batchrun_run r
WHERE r.id IN (
  SELECT MAX(id) FROM batchrun_run
  WHERE job IS NOT NULL AND (outcome <> 'running' OR heartbeat_at < :stale)
  GROUP BY job
);

-- name: ledger_stale_claims
-- Entities claimed but not finished whose run is gone: released by a stopped run (owner
-- NULL) or left by a dead one (lease expired). The rest of state 0 is claimed by a live run.
SELECT COUNT(*) FROM batchrun_ledger
WHERE job = :job AND period = :period AND state = 0
  AND (owner IS NULL OR lease_until < :now);

-- Pause, resume and cancel (batchrun.control.steering): one batchrun_control row per job
-- and period ('' = every period of the job). Every running process reads them at its
-- heartbeat. cancelled_at (epoch ms) ends the runs going on at that time, not later ones.

-- name: control_pause
INSERT INTO batchrun_control (job, period, paused, reason, paused_at, updated_at)
VALUES (:job, :period, 1, :reason, :now, :now)
ON CONFLICT (job, period) DO UPDATE
SET paused = 1, reason = excluded.reason, paused_at = excluded.paused_at,
    updated_at = excluded.updated_at;

-- name: control_cancel
INSERT INTO batchrun_control (job, period, paused, cancelled_at, updated_at)
VALUES (:job, :period, 0, :now, :now)
ON CONFLICT (job, period) DO UPDATE
SET cancelled_at = excluded.cancelled_at, updated_at = excluded.updated_at;

-- name: control_resume_period
UPDATE batchrun_control SET paused = 0, reason = NULL, updated_at = :now
WHERE job = :job AND period = :period AND paused = 1;

-- name: control_resume_job
UPDATE batchrun_control SET paused = 0, reason = NULL, updated_at = :now
WHERE job = :job AND paused = 1;

-- name: control_rows
SELECT job, period, paused, reason, paused_at, cancelled_at FROM batchrun_control;

-- MySQL/MariaDB's upserts for common/control.sql.

-- name: control_pause
INSERT INTO batchrun_control (job, period, paused, reason, paused_at, updated_at)
VALUES (:job, :period, 1, :reason, :now, :now)
ON DUPLICATE KEY UPDATE
  paused = 1, reason = VALUES(reason), paused_at = VALUES(paused_at),
  updated_at = VALUES(updated_at);

-- name: control_cancel
INSERT INTO batchrun_control (job, period, paused, cancelled_at, updated_at)
VALUES (:job, :period, 0, :now, :now)
ON DUPLICATE KEY UPDATE cancelled_at = VALUES(cancelled_at), updated_at = VALUES(updated_at);

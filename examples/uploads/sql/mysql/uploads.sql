-- The uploads job's queries and schema step (mysql).

-- name: migrate_0001_upload_step
-- unless: table upload_step
-- One row per task done, keyed by the task's key: a rerun after a crash adds none.
CREATE TABLE IF NOT EXISTS upload_step (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  task_key VARCHAR(200) NOT NULL UNIQUE,
  user_id BIGINT NOT NULL,
  upload_id BIGINT NOT NULL,
  kind VARCHAR(16) NOT NULL
);

-- name: record_step
INSERT IGNORE INTO upload_step (task_key, user_id, upload_id, kind)
VALUES (:task_key, :user_id, :upload_id, :kind);

-- name: steps_done
SELECT kind FROM upload_step WHERE upload_id = :upload_id;

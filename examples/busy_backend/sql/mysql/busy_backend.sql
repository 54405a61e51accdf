-- The files job's queries and schema step (mysql).

-- name: migrate_0001_file_handoff
-- unless: table file_handoff
-- One row per file the worker backend accepted, keyed by the task's key: a task run
-- again (a crash after the hand-off) finds its row and does not hand the file over twice.
CREATE TABLE IF NOT EXISTS file_handoff (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  task_key VARCHAR(200) NOT NULL UNIQUE,
  user_id BIGINT NOT NULL,
  s3_url VARCHAR(1000) NOT NULL,
  handed_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
);

-- name: handed_off
SELECT id FROM file_handoff WHERE task_key = :key;

-- name: record_handoff
INSERT IGNORE INTO file_handoff (task_key, user_id, s3_url) VALUES (:key, :user_id, :s3_url);

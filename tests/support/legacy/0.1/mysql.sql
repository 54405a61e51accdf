-- batchrun 0.1's schema: batchrun/sql/mysql/migrations.sql of the 0.1 release (commit cc9f2c1),
-- copied unchanged below this header. tests/test_upgrade.py applies it the way 0.1's
-- `batchrun db migrate` did. Do not edit: it is what databases in the field were made by.

-- Schema steps, applied in name order and recorded in batchrun_schema.
-- Every step has an "-- unless:" guard and is skipped when the guard holds, so a database
-- that already has the application's tables only gains what batchrun needs, a dropped
-- batchrun table is recreated, and a complete schema is recognised by its guards.

-- name: migrate_0000_schema_table
-- unless: table batchrun_schema
CREATE TABLE IF NOT EXISTS batchrun_schema (
  step VARCHAR(100) NOT NULL PRIMARY KEY,
  applied_at BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0001_user
-- unless: table user
CREATE TABLE IF NOT EXISTS `user` (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  first_name VARCHAR(255) NULL,
  last_name VARCHAR(255) NULL,
  email VARCHAR(255) NULL,
  date_of_birth DATE NULL,
  status SMALLINT NOT NULL DEFAULT 10
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- name: migrate_0002_gift_card
-- unless: table gift_card
CREATE TABLE IF NOT EXISTS gift_card (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  recipient_email VARCHAR(255) NOT NULL,
  message VARCHAR(255) NOT NULL,
  status SMALLINT NOT NULL DEFAULT 1,
  scheduled_at DATETIME NOT NULL,
  gift_code VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- name: migrate_0003_user_birth_month
-- unless: column user.birth_month
-- One ALTER so a large table is rebuilt once. MariaDB does not rewrite MONTH(date_of_birth)
-- to this column: the page query names birth_month itself.
ALTER TABLE `user`
  ADD COLUMN birth_month TINYINT AS (MONTH(date_of_birth)) STORED,
  ADD INDEX idx_user_birth_month_status_id (birth_month, status, id);

-- name: migrate_0004_user_birth_month_index
-- unless: index user.idx_user_birth_month_status_id
CREATE INDEX idx_user_birth_month_status_id ON `user` (birth_month, status, id);

-- name: migrate_0005_gift_card_idempotency_key
-- unless: column gift_card.idempotency_key
ALTER TABLE gift_card
  ADD COLUMN idempotency_key VARCHAR(64) NULL,
  ADD UNIQUE KEY uq_gift_card_idempotency_key (idempotency_key);

-- name: migrate_0006_gift_card_code_unique
-- unless: unique gift_card.gift_code
ALTER TABLE gift_card ADD UNIQUE KEY uq_gift_card_gift_code (gift_code);

-- name: migrate_0007_task
-- unless: table batchrun_task
-- The ledger: one row per (job, year, user). state: 0 pending/claimed, 1 sent,
-- 2 skipped (invalid address), 3 failed temporarily (retrying), 4 failed for good.
-- owner/lease_until (epoch ms) is the claim that serializes work on one user.
CREATE TABLE IF NOT EXISTS batchrun_task (
  job VARCHAR(32) NOT NULL,
  year SMALLINT NOT NULL,
  user_id BIGINT UNSIGNED NOT NULL,
  month TINYINT NOT NULL,
  state TINYINT NOT NULL DEFAULT 0,
  attempts INT NOT NULL DEFAULT 0,
  owner CHAR(32) NULL,
  lease_until BIGINT NULL,
  queued TINYINT NOT NULL DEFAULT 0,
  last_error VARCHAR(500) NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (job, year, user_id),
  KEY idx_batchrun_task_month_state (job, year, month, state),
  KEY idx_batchrun_task_owner (owner),
  KEY idx_batchrun_task_unqueued (state, queued)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0008_queue
-- unless: table batchrun_queue
-- The local retry queue, with SQS semantics: a received message is invisible until
-- visible_at; after max receives it is dead-lettered (dead = 1).
CREATE TABLE IF NOT EXISTS batchrun_queue (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  body MEDIUMTEXT NOT NULL,
  visible_at BIGINT NOT NULL,
  receive_count INT NOT NULL DEFAULT 0,
  receipt CHAR(32) NULL,
  dead TINYINT NOT NULL DEFAULT 0,
  dead_reason VARCHAR(500) NULL,
  created_at BIGINT NOT NULL,
  KEY idx_batchrun_queue_visible (dead, visible_at),
  KEY idx_batchrun_queue_receipt (receipt)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

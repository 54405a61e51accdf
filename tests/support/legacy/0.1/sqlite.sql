-- batchrun 0.1's schema: batchrun/sql/sqlite/migrations.sql of the 0.1 release (commit cc9f2c1),
-- copied unchanged below this header. tests/test_upgrade.py applies it the way 0.1's
-- `batchrun db migrate` did. Do not edit: it is what databases in the field were made by.

-- Schema steps, applied in name order and recorded in batchrun_schema.
-- Every step has an "-- unless:" guard and is skipped when the guard holds, so a database
-- that already has the application's tables only gains what batchrun needs, a dropped
-- batchrun table is recreated, and a complete schema is recognised by its guards.
-- Dates are ISO YYYY-MM-DD text.

-- name: migrate_0000_schema_table
-- unless: table batchrun_schema
CREATE TABLE IF NOT EXISTS batchrun_schema (
  step TEXT NOT NULL PRIMARY KEY,
  applied_at INTEGER NOT NULL
);

-- name: migrate_0001_user
-- unless: table user
CREATE TABLE IF NOT EXISTS user (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  first_name TEXT NULL,
  last_name TEXT NULL,
  email TEXT NULL,
  date_of_birth TEXT NULL,
  status INTEGER NOT NULL DEFAULT 10
);

-- name: migrate_0002_gift_card
-- unless: table gift_card
CREATE TABLE IF NOT EXISTS gift_card (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  recipient_email TEXT NOT NULL,
  message TEXT NOT NULL,
  status INTEGER NOT NULL DEFAULT 1,
  scheduled_at TEXT NOT NULL,
  gift_code TEXT NOT NULL
);

-- name: migrate_0003_user_birth_month
-- unless: column user.birth_month
-- SQLite can only add a VIRTUAL generated column to an existing table; the index stores it.
ALTER TABLE user ADD COLUMN birth_month INTEGER
  GENERATED ALWAYS AS (CAST(strftime('%m', date_of_birth) AS INTEGER)) VIRTUAL;

-- name: migrate_0004_user_birth_month_index
-- unless: index user.idx_user_birth_month_status_id
CREATE INDEX idx_user_birth_month_status_id ON user (birth_month, status, id);

-- name: migrate_0005_gift_card_idempotency_key
-- unless: column gift_card.idempotency_key
ALTER TABLE gift_card ADD COLUMN idempotency_key TEXT NULL;

-- name: migrate_0006_gift_card_idempotency_key_unique
-- unless: unique gift_card.idempotency_key
CREATE UNIQUE INDEX uq_gift_card_idempotency_key ON gift_card (idempotency_key);

-- name: migrate_0007_gift_card_code_unique
-- unless: unique gift_card.gift_code
CREATE UNIQUE INDEX uq_gift_card_gift_code ON gift_card (gift_code);

-- name: migrate_0008_task
-- unless: table batchrun_task
-- The ledger: one row per (job, year, user). state: 0 pending/claimed, 1 sent,
-- 2 skipped (invalid address), 3 failed temporarily (retrying), 4 failed for good.
-- owner/lease_until (epoch ms) is the claim that serializes work on one user.
CREATE TABLE IF NOT EXISTS batchrun_task (
  job TEXT NOT NULL,
  year INTEGER NOT NULL,
  user_id INTEGER NOT NULL,
  month INTEGER NOT NULL,
  state INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  owner TEXT NULL,
  lease_until INTEGER NULL,
  queued INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (job, year, user_id)
) WITHOUT ROWID;

-- name: migrate_0009_task_indexes
-- unless: index batchrun_task.idx_batchrun_task_month_state
CREATE INDEX IF NOT EXISTS idx_batchrun_task_month_state ON batchrun_task (job, year, month, state);

-- name: migrate_0010_task_owner_index
-- unless: index batchrun_task.idx_batchrun_task_owner
CREATE INDEX IF NOT EXISTS idx_batchrun_task_owner ON batchrun_task (owner);

-- name: migrate_0011_task_unqueued_index
-- unless: index batchrun_task.idx_batchrun_task_unqueued
CREATE INDEX IF NOT EXISTS idx_batchrun_task_unqueued ON batchrun_task (state, queued);

-- name: migrate_0012_queue
-- unless: table batchrun_queue
-- The local retry queue, with SQS semantics: a received message is invisible until
-- visible_at; after max receives it is dead-lettered (dead = 1).
CREATE TABLE IF NOT EXISTS batchrun_queue (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  body TEXT NOT NULL,
  visible_at INTEGER NOT NULL,
  receive_count INTEGER NOT NULL DEFAULT 0,
  receipt TEXT NULL,
  dead INTEGER NOT NULL DEFAULT 0,
  dead_reason TEXT NULL,
  created_at INTEGER NOT NULL
);

-- name: migrate_0013_queue_indexes
-- unless: index batchrun_queue.idx_batchrun_queue_visible
CREATE INDEX IF NOT EXISTS idx_batchrun_queue_visible ON batchrun_queue (dead, visible_at);

-- name: migrate_0014_queue_receipt_index
-- unless: index batchrun_queue.idx_batchrun_queue_receipt
CREATE INDEX IF NOT EXISTS idx_batchrun_queue_receipt ON batchrun_queue (receipt);

-- The birthday job's schema steps, applied by `batchrun db migrate` after batchrun's own.
-- On an application database that already has `user` and `gift_card` they only add what
-- the job needs; the seed's tables are created only where they do not exist.

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


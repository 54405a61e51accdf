-- The credits job's queries and schema steps (SQLite; times are UTC 'YYYY-MM-DD HH:MM:SS').
-- Steps run in name order; each is skipped when its "-- unless:" guard already holds.

-- name: migrate_0001_customer
-- unless: table customer
CREATE TABLE IF NOT EXISTS customer (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  email TEXT NULL,
  plan TEXT NOT NULL,
  active INTEGER NOT NULL DEFAULT 1
);

-- name: migrate_0002_customer_active_index
-- unless: index customer.idx_customer_active_id
CREATE INDEX IF NOT EXISTS idx_customer_active_id ON customer (active, id);

-- name: migrate_0003_credit_grant
-- unless: table credit_grant
-- One row per grant the API answered, keyed by the Idempotency-Key it was asked with
-- ("credits:2025-06:42"): the UNIQUE constraint is what makes the record exactly-once.
CREATE TABLE IF NOT EXISTS credit_grant (
  idempotency_key TEXT NOT NULL UNIQUE,
  customer_id INTEGER NOT NULL,
  amount INTEGER NOT NULL,
  api_grant_id TEXT NOT NULL,
  created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);

-- name: page
SELECT id, email, plan
FROM customer
WHERE active = 1 AND id > :after
ORDER BY id
LIMIT :limit;

-- name: grant_for_key
SELECT api_grant_id FROM credit_grant WHERE idempotency_key = :key;

-- name: record_grant
INSERT OR IGNORE INTO credit_grant (idempotency_key, customer_id, amount, api_grant_id)
VALUES (:key, :customer_id, :amount, :api_grant_id);

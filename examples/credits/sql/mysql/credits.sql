-- The credits job's queries and schema steps (MySQL/MariaDB).
-- Steps run in name order; each is skipped when its "-- unless:" guard already holds, so on
-- an application's own customer table only what is missing is added, online.

-- name: migrate_0001_customer
-- unless: table customer
CREATE TABLE IF NOT EXISTS customer (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(255) NULL,
  plan VARCHAR(32) NOT NULL,
  active TINYINT NOT NULL DEFAULT 1
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- name: migrate_0002_customer_active_index
-- unless: index customer.idx_customer_active_id
ALTER TABLE customer
  ADD INDEX idx_customer_active_id (active, id),
  ALGORITHM=INPLACE, LOCK=NONE;

-- name: migrate_0003_credit_grant
-- unless: table credit_grant
-- One row per grant the API answered, keyed by the Idempotency-Key it was asked with
-- ("credits:2025-06:42"): the UNIQUE key is what makes the record exactly-once.
CREATE TABLE IF NOT EXISTS credit_grant (
  idempotency_key VARCHAR(100) NOT NULL,
  customer_id BIGINT UNSIGNED NOT NULL,
  amount INT NOT NULL,
  api_grant_id VARCHAR(100) NOT NULL,
  created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  UNIQUE KEY uq_credit_grant_idempotency_key (idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: page
SELECT id, email, plan
FROM customer
WHERE active = 1 AND id > :after
ORDER BY id
LIMIT :limit;

-- name: grant_for_key
SELECT api_grant_id FROM credit_grant WHERE idempotency_key = :key;

-- name: record_grant
INSERT IGNORE INTO credit_grant (idempotency_key, customer_id, amount, api_grant_id)
VALUES (:key, :customer_id, :amount, :api_grant_id);

-- The birthday job's schema steps, applied by `batchrun db migrate` after batchrun's own.
-- On an application database that already has `user` and `gift_card` they only add what
-- the job needs; the seed's tables are created only where they do not exist.

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
-- Online (see README "Safe on a production database"): a VIRTUAL column is instant on
-- MariaDB 10.11, where a STORED one would copy the whole table under a write lock; the
-- index stores its values. Every DDL on an application table states its algorithm and
-- lock, so the server refuses rather than silently locking. A STORED column from an
-- earlier migrate stays as it is (the guard sees the column). MariaDB does not rewrite
-- MONTH(date_of_birth) to this column: the page query names birth_month itself.
ALTER TABLE `user`
  ADD COLUMN birth_month TINYINT AS (MONTH(date_of_birth)) VIRTUAL,
  ALGORITHM=INSTANT;

-- name: migrate_0004_user_birth_month_index
-- unless: index user.idx_user_birth_month_status_id
ALTER TABLE `user`
  ADD INDEX idx_user_birth_month_status_id (birth_month, status, id),
  ALGORITHM=INPLACE, LOCK=NONE;

-- name: migrate_0005_gift_card_idempotency_key
-- unless: column gift_card.idempotency_key
ALTER TABLE gift_card ADD COLUMN idempotency_key VARCHAR(64) NULL, ALGORITHM=INSTANT;

-- name: migrate_0006_gift_card_idempotency_key_unique
-- unless: unique gift_card.idempotency_key
ALTER TABLE gift_card
  ADD UNIQUE KEY uq_gift_card_idempotency_key (idempotency_key),
  ALGORITHM=INPLACE, LOCK=NONE;

-- name: migrate_0007_gift_card_code_unique
-- unless: unique gift_card.gift_code
ALTER TABLE gift_card
  ADD UNIQUE KEY uq_gift_card_gift_code (gift_code),
  ALGORITHM=INPLACE, LOCK=NONE;

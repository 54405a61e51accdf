-- The renewal job's queries and schema steps (MySQL/MariaDB).
-- Steps run in name order; each is skipped when its "-- unless:" guard already holds, so on
-- an application's own account table only the missing index is added, online.

-- name: migrate_0001_account
-- unless: table account
CREATE TABLE IF NOT EXISTS account (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  contact VARCHAR(255) NULL,
  name VARCHAR(255) NOT NULL,
  renews_on DATE NOT NULL,
  active TINYINT NOT NULL DEFAULT 1
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- name: migrate_0002_account_renews_on_index
-- unless: index account.idx_account_renews_on_active_id
-- The page is one index range: renews_on and active by equality, then id in order.
ALTER TABLE account
  ADD INDEX idx_account_renews_on_active_id (renews_on, active, id),
  ALGORITHM=INPLACE, LOCK=NONE;

-- name: page
-- A keyset page: the next :limit active accounts renewing on :day after id :after.
SELECT id, contact AS email, name
FROM account
WHERE renews_on = :day AND active = 1 AND id > :after
ORDER BY id
LIMIT :limit;

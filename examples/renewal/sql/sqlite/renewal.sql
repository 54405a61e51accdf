-- The renewal job's queries and schema steps (SQLite; dates are ISO YYYY-MM-DD text).
-- Steps run in name order; each is skipped when its "-- unless:" guard already holds.

-- name: migrate_0001_account
-- unless: table account
CREATE TABLE IF NOT EXISTS account (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  contact TEXT NULL,
  name TEXT NOT NULL,
  renews_on TEXT NOT NULL,
  active INTEGER NOT NULL DEFAULT 1
);

-- name: migrate_0002_account_renews_on_index
-- unless: index account.idx_account_renews_on_active_id
-- The page is one index range: renews_on and active by equality, then id in order.
CREATE INDEX IF NOT EXISTS idx_account_renews_on_active_id ON account (renews_on, active, id);

-- name: page
-- A keyset page: the next :limit active accounts renewing on :day after id :after.
SELECT id, contact AS email, name
FROM account
WHERE renews_on = :day AND active = 1 AND id > :after
ORDER BY id
LIMIT :limit;

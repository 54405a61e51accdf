-- name: page
-- A keyset page over idx_user_birth_month_status_id: each page costs its own rows, never a
-- rescan. MariaDB does not rewrite MONTH(date_of_birth) to the generated column: the query
-- names birth_month itself. batchrun leaves out the users already finished this year.
-- FORCE INDEX: for the month's early pages (a small :after) MariaDB estimates the range on
-- (birth_month, status, id) no better than ref on (birth_month, status), takes ref, and
-- reads the month from its first user on every page: 20 rows per user at 1M users
-- (make bench), 1.0 with the range.
SELECT id, first_name, last_name, email
FROM `user` FORCE INDEX (idx_user_birth_month_status_id)
WHERE birth_month = :month AND status = 10 AND id > :after AND email IS NOT NULL
ORDER BY id
LIMIT :limit;

-- name: explain_page
-- Without page's FORCE INDEX: db explain shows what the server would choose, and still
-- answers (slow) when the index is missing.
EXPLAIN
SELECT id, first_name, last_name, email
FROM `user`
WHERE birth_month = :month AND status = 10 AND id > :after AND email IS NOT NULL
ORDER BY id
LIMIT :limit;

-- name: any_user
SELECT id FROM `user` LIMIT 1;

-- name: last_user
SELECT MAX(id) FROM `user`;

-- name: insert_users
INSERT INTO `user` (first_name, last_name, email, date_of_birth, status) VALUES :rows;

-- name: index_and_rows
-- For db explain: whether idx_user_birth_month_status_id exists, and the table's row
-- estimate and size (PostgreSQL's planner may skip an index on a small table; not used
-- for MySQL, whose plan names the index).
SELECT
  (SELECT COUNT(*) FROM information_schema.STATISTICS
   WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'user'
     AND INDEX_NAME = 'idx_user_birth_month_status_id' AND SEQ_IN_INDEX = 1) AS has_index,
  COALESCE((SELECT TABLE_ROWS FROM information_schema.TABLES
   WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'user'), -1) AS estimate,
  COALESCE((SELECT DATA_LENGTH FROM information_schema.TABLES
   WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'user'), 0) AS bytes;

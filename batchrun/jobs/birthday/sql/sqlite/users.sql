-- name: page
-- A keyset page over idx_user_birth_month_status_id: each page costs its own rows, never a
-- rescan. MariaDB does not rewrite MONTH(date_of_birth) to the generated column: the query
-- names birth_month itself. batchrun leaves out the users already finished this year.
SELECT id, first_name, last_name, email
FROM user
WHERE birth_month = :month AND status = 10 AND id > :after AND email IS NOT NULL
ORDER BY id
LIMIT :limit;

-- name: explain_page
EXPLAIN QUERY PLAN
SELECT id, first_name, last_name, email
FROM user
WHERE birth_month = :month AND status = 10 AND id > :after AND email IS NOT NULL
ORDER BY id
LIMIT :limit;

-- name: any_user
SELECT id FROM user LIMIT 1;

-- name: last_user
SELECT MAX(id) FROM user;

-- name: insert_users
INSERT INTO user (first_name, last_name, email, date_of_birth, status) VALUES :rows;

-- name: index_and_rows
-- For db explain: whether idx_user_birth_month_status_id exists, and the database's size
-- (PostgreSQL's planner may skip an index on a small table; not used for SQLite, whose
-- plan names the index). No row estimate: -1.
SELECT
  (SELECT COUNT(*) FROM sqlite_master
   WHERE type = 'index' AND name = 'idx_user_birth_month_status_id') AS has_index,
  -1 AS estimate,
  (SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()) AS bytes;

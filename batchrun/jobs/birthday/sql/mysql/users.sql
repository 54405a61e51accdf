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

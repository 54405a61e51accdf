-- name: page
-- A keyset page over idx_user_birth_month_status_id, an index on the expression
-- (EXTRACT(MONTH FROM date_of_birth)), status, id: the query names that same expression,
-- so each page costs its own rows, never a rescan. batchrun leaves out the users already
-- finished this year.
SELECT id, first_name, last_name, email
FROM "user"
WHERE EXTRACT(MONTH FROM date_of_birth) = :month AND status = 10 AND id > :after
  AND email IS NOT NULL
ORDER BY id
LIMIT :limit;

-- name: explain_page
EXPLAIN
SELECT id, first_name, last_name, email
FROM "user"
WHERE EXTRACT(MONTH FROM date_of_birth) = :month AND status = 10 AND id > :after
  AND email IS NOT NULL
ORDER BY id
LIMIT :limit;

-- name: any_user
SELECT id FROM "user" LIMIT 1;

-- name: last_user
SELECT MAX(id) FROM "user";

-- name: insert_users
INSERT INTO "user" (first_name, last_name, email, date_of_birth, status) VALUES :rows;

-- name: page
-- A keyset page over idx_user_birth_month_status_id, an index on the expression
-- (EXTRACT(MONTH FROM date_of_birth)), status, id: each page costs its own rows, never a
-- rescan. Written as one range of that index's key, (month, 10, after) < key <= (month,
-- 10), ordered by the whole key: with plain equalities PostgreSQL plans the primary key
-- instead (ids in table order look cheaper than the index's heap fetches) and reads some
-- twelve rows for each one it returns. batchrun leaves out the users finished this year.
SELECT id, first_name, last_name, email
FROM "user"
WHERE (EXTRACT(MONTH FROM date_of_birth), status, id) > (:month, 10, :after)
  AND (EXTRACT(MONTH FROM date_of_birth), status) <= (:month, 10)
  AND email IS NOT NULL
ORDER BY EXTRACT(MONTH FROM date_of_birth), status, id
LIMIT :limit;

-- name: explain_page
EXPLAIN
SELECT id, first_name, last_name, email
FROM "user"
WHERE (EXTRACT(MONTH FROM date_of_birth), status, id) > (:month, 10, :after)
  AND (EXTRACT(MONTH FROM date_of_birth), status) <= (:month, 10)
  AND email IS NOT NULL
ORDER BY EXTRACT(MONTH FROM date_of_birth), status, id
LIMIT :limit;

-- name: any_user
SELECT id FROM "user" LIMIT 1;

-- name: last_user
SELECT MAX(id) FROM "user";

-- name: insert_users
INSERT INTO "user" (first_name, last_name, email, date_of_birth, status) VALUES :rows;

-- name: index_and_rows
-- For db explain: whether idx_user_birth_month_status_id exists (and is valid), the
-- planner's row estimate of "user" (-1: never analyzed) and its size on disk.
SELECT
  (SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
   WHERE c.relname = 'idx_user_birth_month_status_id' AND i.indisvalid) AS has_index,
  (SELECT reltuples::bigint FROM pg_class WHERE oid = '"user"'::regclass) AS estimate,
  pg_relation_size('"user"') AS bytes;

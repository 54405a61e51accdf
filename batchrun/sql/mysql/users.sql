-- name: eligible_page
-- A keyset page over idx_user_birth_month_status_id: each page costs its own rows, never a
-- rescan. Users already finished for the year (sent, skipped, failed for good) are left out.
SELECT u.id, u.first_name, u.last_name, u.email, t.state, t.owner, t.lease_until
FROM `user` u
LEFT JOIN batchrun_task t ON t.job = :job AND t.year = :year AND t.user_id = u.id
WHERE u.birth_month = :month AND u.status = 10 AND u.id > :after AND u.id <= :until
  AND u.email IS NOT NULL
  AND (t.state IS NULL OR t.state IN (0, 3))
ORDER BY u.id
LIMIT :limit;

-- name: eligible_page_fresh
-- The same page for a month with no ledger rows yet (its first run): the index range alone,
-- about one row read per user. Correct whatever other runs do meanwhile, because claiming
-- reads back any row another run inserted or finished (the join above only skips them
-- sooner, which pays on reruns).
SELECT u.id, u.first_name, u.last_name, u.email, NULL, NULL, NULL
FROM `user` u
WHERE u.birth_month = :month AND u.status = 10 AND u.id > :after AND u.id <= :until
  AND u.email IS NOT NULL
ORDER BY u.id
LIMIT :limit;

-- name: eligible_ids_page
-- The fan-out producer's walk: ids only, the same filter and index as eligible_page.
SELECT u.id
FROM `user` u
LEFT JOIN batchrun_task t ON t.job = :job AND t.year = :year AND t.user_id = u.id
WHERE u.birth_month = :month AND u.status = 10 AND u.id > :after
  AND u.email IS NOT NULL
  AND (t.state IS NULL OR t.state IN (0, 3))
ORDER BY u.id
LIMIT :limit;

-- name: users_by_id
SELECT id, first_name, last_name, email, status, birth_month
FROM `user` WHERE id IN :ids*;

-- name: any_user
SELECT id FROM `user` LIMIT 1;

-- name: insert_users
INSERT INTO `user` (first_name, last_name, email, date_of_birth, status) VALUES :rows*;

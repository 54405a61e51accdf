-- name: status_counts
SELECT
  COALESCE(SUM(CASE WHEN state = 1 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 2 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 3 THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 4 THEN 1 ELSE 0 END), 0)
FROM batchrun_task
WHERE job = :job AND year = :year AND month = :month;

-- name: status_cards
SELECT COUNT(*) FROM batchrun_task t
-- Built from the :job literal, not the t.job column, so the column's collation decides
-- and the unique index on idempotency_key is used, whatever the application's collation.
JOIN gift_card g ON g.idempotency_key = CONCAT(:job, ':', t.year, ':', t.user_id)
WHERE t.job = :job AND t.year = :year AND t.month = :month;

-- name: status_pending
-- Eligible users not yet finished: never touched, claimed, or waiting for a retry.
SELECT COUNT(*) FROM `user` u
LEFT JOIN batchrun_task t ON t.job = :job AND t.year = :year AND t.user_id = u.id
WHERE u.birth_month = :month AND u.status = 10 AND u.email IS NOT NULL
  AND (t.state IS NULL OR t.state IN (0, 3));

-- name: status_problems
SELECT user_id, state, attempts, last_error FROM batchrun_task
WHERE job = :job AND year = :year AND month = :month AND state IN (2, 3, 4)
ORDER BY user_id
LIMIT :limit;

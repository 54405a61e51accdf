-- name: status_cards
SELECT COUNT(*) FROM batchrun_ledger t
-- Built from the :job literal, not the t.job column, so the column's collation decides
-- and the unique index on idempotency_key is used, whatever the application's collation.
JOIN gift_card g ON g.idempotency_key = CONCAT(:job, ':', CAST(t.once_key AS UNSIGNED), ':', t.entity_id)
WHERE t.job = :job AND t.period = :period;

-- name: status_pending
-- Eligible users not yet finished this year: never touched, claimed, or waiting for a retry.
SELECT COUNT(*) FROM `user` u
LEFT JOIN batchrun_ledger t ON t.job = :job AND t.once_key = :once AND t.entity_id = u.id
WHERE u.birth_month = :month AND u.status = 10 AND u.email IS NOT NULL
  AND (t.state IS NULL OR t.state IN (0, 3));

-- name: status_cards
SELECT COUNT(*) FROM batchrun_ledger t
-- Built from the :job literal, not the t.job column, so the unique index on
-- idempotency_key is used.
JOIN gift_card g ON g.idempotency_key = CAST(:job AS text) || ':'
  || CAST(CAST(t.once_key AS integer) AS text) || ':' || CAST(t.entity_id AS text)
WHERE t.job = :job AND t.period = :period;

-- name: status_pending
-- Eligible users not yet finished this year: never touched, claimed, or waiting for a retry.
SELECT COUNT(*) FROM "user" u
LEFT JOIN batchrun_ledger t ON t.job = :job AND t.once_key = :once AND t.entity_id = u.id
WHERE EXTRACT(MONTH FROM u.date_of_birth) = :month AND u.status = 10 AND u.email IS NOT NULL
  AND (t.state IS NULL OR t.state IN (0, 3));

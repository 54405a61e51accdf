-- name: insert_cards
-- ON CONFLICT DO NOTHING on either unique key (idempotency_key, gift_code): at most one
-- card per (job, year, user), whatever runs overlap. A row also skipped for a gift_code
-- collision is retried with a fresh code.
INSERT INTO gift_card
  (recipient_email, message, status, scheduled_at, gift_code, idempotency_key)
VALUES :rows
ON CONFLICT DO NOTHING;

-- name: insert_cards
-- INSERT IGNORE on the idempotency key: at most one card per (job, year, user), whatever
-- runs overlap. A row also ignored for a gift_code collision is retried with a fresh code.
INSERT IGNORE INTO gift_card
  (recipient_email, message, status, scheduled_at, gift_code, idempotency_key)
VALUES :rows;

-- The cards' statements every dialect shares.

-- name: cards_by_key
SELECT idempotency_key, gift_code FROM gift_card WHERE idempotency_key IN :keys;

-- The suppression list: addresses no job may mail, one row per normalised address (the
-- local part as given, '@', the domain lower-cased), with why (unsubscribe, bounce,
-- complaint, manual), where it came from (a job's name, cli, ...) and when (epoch ms).

-- name: suppression_of
SELECT address, reason FROM batchrun_suppression WHERE address IN :addresses;

-- name: suppression_get
SELECT address, reason, source, created_at FROM batchrun_suppression WHERE address = :address;

-- name: suppression_remove
DELETE FROM batchrun_suppression WHERE address = :address;

-- name: suppression_page
-- Keyset pages in address order: `suppress list` reads any size in bounded memory.
SELECT address, reason, source, created_at FROM batchrun_suppression
WHERE address > :after
ORDER BY address
LIMIT :limit;

-- name: migrate_0040_suppression_keys
-- unless: recorded
-- A data step in Python (Store.rekey_suppressions: IDNA is not SQL): every stored address
-- rewritten to the one key batchrun compares in now (batchrun.mail.address.address_key:
-- the domain in A-labels, the whole address NFC and case-folded), so a row stored as
-- 'Jo@bücher.example' still matches; where two rows meet, the one already there stays.

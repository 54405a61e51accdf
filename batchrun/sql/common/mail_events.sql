-- Bounces and complaints (batchrun.events.ses): a permanent bounce or a complaint SES
-- reports for a message batchrun sent is noted on the entity's ledger row (mail_event:
-- 'bounce' or 'complaint'; a complaint wins over a bounce), beside its state, which stays
-- as it was (the email was accepted; it is the address that is bad).

-- name: migrate_0021_ledger_mail_event
-- unless: column batchrun_ledger.mail_event
ALTER TABLE batchrun_ledger ADD COLUMN mail_event VARCHAR(16) NULL;

-- name: ledger_mail_event
UPDATE batchrun_ledger SET mail_event = :event
WHERE job = :job AND once_key = :once AND entity_id = :id
  AND (mail_event IS NULL OR mail_event <> 'complaint');

-- name: status_mail_events
SELECT
  COALESCE(SUM(CASE WHEN mail_event = 'bounce' THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN mail_event = 'complaint' THEN 1 ELSE 0 END), 0)
FROM batchrun_ledger
WHERE job = :job AND period = :period AND mail_event IS NOT NULL;

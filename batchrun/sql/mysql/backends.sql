-- name: slot_insert
INSERT IGNORE INTO batchrun_backend_slot (backend, slot, owner, lease_until)
VALUES :rows;

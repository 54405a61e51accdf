-- name: slot_insert
INSERT INTO batchrun_backend_slot (backend, slot, owner, lease_until)
VALUES :rows
ON CONFLICT (backend, slot) DO NOTHING;

-- Schema steps, applied in name order and recorded in batchrun_schema.
-- Every step has an "-- unless:" guard and is skipped when the guard holds, so a database
-- that already has the application's tables only gains what batchrun needs, a dropped
-- batchrun table is recreated, and a complete schema is recognised by its guards.
-- Dates are ISO YYYY-MM-DD text.

-- name: migrate_0000_schema_table
-- unless: table batchrun_schema
CREATE TABLE IF NOT EXISTS batchrun_schema (
  step TEXT NOT NULL PRIMARY KEY,
  applied_at INTEGER NOT NULL
);

-- name: migrate_0012_queue
-- unless: table batchrun_queue
-- The local retry queue, with SQS semantics: a received message is invisible until
-- visible_at; after max receives it is dead-lettered (dead = 1).
CREATE TABLE IF NOT EXISTS batchrun_queue (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  body TEXT NOT NULL,
  visible_at INTEGER NOT NULL,
  receive_count INTEGER NOT NULL DEFAULT 0,
  receipt TEXT NULL,
  dead INTEGER NOT NULL DEFAULT 0,
  dead_reason TEXT NULL,
  created_at INTEGER NOT NULL
);

-- name: migrate_0013_queue_indexes
-- unless: index batchrun_queue.idx_batchrun_queue_visible
CREATE INDEX IF NOT EXISTS idx_batchrun_queue_visible ON batchrun_queue (dead, visible_at);

-- name: migrate_0014_queue_receipt_index
-- unless: index batchrun_queue.idx_batchrun_queue_receipt
CREATE INDEX IF NOT EXISTS idx_batchrun_queue_receipt ON batchrun_queue (receipt);
-- name: migrate_0015_ledger
-- unless: table batchrun_ledger
-- The ledger (see common/ledger.sql): one row per (job, once_per period, entity).
CREATE TABLE IF NOT EXISTS batchrun_ledger (
  job TEXT NOT NULL,
  once_key TEXT NOT NULL,
  entity_id INTEGER NOT NULL,
  period TEXT NOT NULL,
  state INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  owner TEXT NULL,
  lease_until INTEGER NULL,
  queued INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (job, once_key, entity_id)
) WITHOUT ROWID;

-- name: migrate_0016_ledger_period_index
-- unless: index batchrun_ledger.idx_batchrun_ledger_period_state
CREATE INDEX IF NOT EXISTS idx_batchrun_ledger_period_state ON batchrun_ledger (job, period, state);

-- name: migrate_0017_ledger_owner_index
-- unless: index batchrun_ledger.idx_batchrun_ledger_owner
CREATE INDEX IF NOT EXISTS idx_batchrun_ledger_owner ON batchrun_ledger (owner);

-- name: migrate_0018_ledger_unqueued_index
-- unless: index batchrun_ledger.idx_batchrun_ledger_unqueued
CREATE INDEX IF NOT EXISTS idx_batchrun_ledger_unqueued ON batchrun_ledger (state, queued);

-- name: migrate_0019_ledger_from_task
-- unless: recorded
-- unless: missing batchrun_task
-- Upgrade in place: the rows of the birthday-only ledger of batchrun 0.1 (batchrun_task,
-- keyed by job, year, user) become ledger rows keyed by the year; the old table stays.
INSERT OR IGNORE INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued,
   last_error, updated_at)
SELECT job, printf('%04d', year), user_id, printf('%04d-%02d', year, month),
  state, attempts, owner, lease_until, queued, last_error, updated_at
FROM batchrun_task;

-- name: migrate_0020_suppression
-- unless: table batchrun_suppression
-- The suppression list (see common/suppression.sql). address is the normalised key: the
-- local part as given, '@', the domain lower-cased; TEXT compares exactly (BINARY).
CREATE TABLE IF NOT EXISTS batchrun_suppression (
  address TEXT NOT NULL PRIMARY KEY,
  reason TEXT NOT NULL CHECK (reason IN ('unsubscribe', 'bounce', 'complaint', 'manual')),
  source TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL
) WITHOUT ROWID;

-- name: table_rows_stat
-- ANALYZE's row count of a table, the first number of its stat (`db migrate --plan`).
SELECT stat FROM sqlite_stat1 WHERE tbl = :table ORDER BY idx IS NOT NULL LIMIT 1;

-- name: table_rows_count
-- A table's rows without naming it in SQL (an identifier cannot be bound): the cells of its
-- b-tree's leaf pages, from the dbstat virtual table (`db migrate --plan`).
SELECT SUM(ncell) FROM dbstat WHERE name = :table AND pagetype = 'leaf';

-- name: migrate_0030_run
-- unless: table batchrun_run
-- Run history (see common/history.sql): one row per run, retry drain, worker process,
-- Lambda invocation and events drain. Times are epoch ms; counts is the run's JSON
-- summary; job and period are NULL for a process serving every job.
CREATE TABLE IF NOT EXISTS batchrun_run (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job TEXT NULL,
  period TEXT NULL,
  kind TEXT NOT NULL,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  version TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  heartbeat_at INTEGER NOT NULL,
  ended_at INTEGER NULL,
  exit_code INTEGER NULL,
  outcome TEXT NOT NULL DEFAULT 'running',
  counts TEXT NULL,
  error TEXT NULL
);

-- name: migrate_0031_run_job_index
-- unless: index batchrun_run.idx_batchrun_run_job
CREATE INDEX IF NOT EXISTS idx_batchrun_run_job ON batchrun_run (job, id);

-- name: migrate_0032_run_outcome_index
-- unless: index batchrun_run.idx_batchrun_run_outcome
CREATE INDEX IF NOT EXISTS idx_batchrun_run_outcome ON batchrun_run (outcome);

-- name: migrate_0033_control
-- unless: table batchrun_control
-- Pause and cancel (see common/control.sql): one row per job and period ('' = every
-- period of the job). cancelled_at ends the runs going on at that time, not later ones.
CREATE TABLE IF NOT EXISTS batchrun_control (
  job TEXT NOT NULL,
  period TEXT NOT NULL DEFAULT '',
  paused INTEGER NOT NULL DEFAULT 0,
  reason TEXT NULL,
  paused_at INTEGER NULL,
  cancelled_at INTEGER NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (job, period)
) WITHOUT ROWID;

-- name: migrate_0034_ledger_run_id
-- unless: column batchrun_ledger.run_id
-- The batchrun_run row that last claimed the entity (its step's run, for `why`).
ALTER TABLE batchrun_ledger ADD COLUMN run_id INTEGER NULL;
-- name: migrate_0065_entity_task
-- unless: table batchrun_entity_task
-- Submitted tasks (see common/tasks.sql): one row per (job, task_key), run exactly once;
-- state 0 pending, 1 running, 2 succeeded, 3 failed (waits for another attempt), 4 dead.
CREATE TABLE IF NOT EXISTS batchrun_entity_task (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job TEXT NOT NULL,
  task_key TEXT NOT NULL,
  entity_id INTEGER NOT NULL,
  data TEXT NOT NULL,
  state INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  owner TEXT NULL,
  lease_until INTEGER NULL,
  last_error TEXT NULL,
  created_at INTEGER NOT NULL,
  started_at INTEGER NULL,
  finished_at INTEGER NULL,
  UNIQUE (job, task_key)
);

-- name: migrate_0066_entity_task_indexes
-- unless: index batchrun_entity_task.idx_batchrun_entity_task_entity
CREATE INDEX IF NOT EXISTS idx_batchrun_entity_task_entity
  ON batchrun_entity_task (job, entity_id, state, id);

-- name: migrate_0067_entity_turn
-- unless: table batchrun_entity_turn
-- Whose turn it is to run one entity's tasks: a lease, held while one of them runs.
CREATE TABLE IF NOT EXISTS batchrun_entity_turn (
  job TEXT NOT NULL,
  entity_id INTEGER NOT NULL,
  owner TEXT NULL,
  lease_until INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (job, entity_id)
) WITHOUT ROWID;

-- name: migrate_0068_backend_slot
-- unless: table batchrun_backend_slot
-- Slots of shared backends (Backend(concurrency=N, shared=True), see common/backends.sql):
-- a lease per slot, held while a call runs.
CREATE TABLE IF NOT EXISTS batchrun_backend_slot (
  backend TEXT NOT NULL,
  slot INTEGER NOT NULL,
  owner TEXT NULL,
  lease_until INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (backend, slot)
) WITHOUT ROWID;

-- name: migrate_0069_entity_task_resent_at
-- unless: column batchrun_entity_task.resent_at
-- When a task's message was last sent again because it looked lost (tasks/resend.py).
ALTER TABLE batchrun_entity_task ADD COLUMN resent_at INTEGER NULL;

-- name: migrate_0070_entity_task_retry_at
-- unless: column batchrun_entity_task.retry_at
-- A failed task's next attempt starts no earlier than this (ms): a second message of the
-- task (a duplicate delivery, one sent again) waits for it.
ALTER TABLE batchrun_entity_task ADD COLUMN retry_at INTEGER NULL;

-- name: migrate_0071_entity_task_unstarted
-- unless: index batchrun_entity_task.idx_batchrun_entity_task_unstarted
-- The tasks no process ever started, by job in id order: where the sweep for lost tasks
-- reads (tasks/resend.py), however many finished rows the table keeps.
CREATE INDEX IF NOT EXISTS idx_batchrun_entity_task_unstarted
  ON batchrun_entity_task (job, id) WHERE state = 0 AND started_at IS NULL;

-- name: migrate_0072_entity_task_run_id
-- unless: column batchrun_entity_task.run_id
-- The batchrun_run row (a worker, a Lambda invocation, a retry drain) that last started
-- the task: `why` names it.
ALTER TABLE batchrun_entity_task ADD COLUMN run_id INTEGER NULL;

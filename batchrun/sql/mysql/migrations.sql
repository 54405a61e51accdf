-- Schema steps, applied in name order and recorded in batchrun_schema.
-- Every step has an "-- unless:" guard and is skipped when the guard holds, so a database
-- that already has the application's tables only gains what batchrun needs, a dropped
-- batchrun table is recreated, and a complete schema is recognised by its guards.

-- name: migrate_0000_schema_table
-- unless: table batchrun_schema
CREATE TABLE IF NOT EXISTS batchrun_schema (
  step VARCHAR(100) NOT NULL PRIMARY KEY,
  applied_at BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0008_queue
-- unless: table batchrun_queue
-- The local retry queue, with SQS semantics: a received message is invisible until
-- visible_at; after max receives it is dead-lettered (dead = 1).
CREATE TABLE IF NOT EXISTS batchrun_queue (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  body MEDIUMTEXT NOT NULL,
  visible_at BIGINT NOT NULL,
  receive_count INT NOT NULL DEFAULT 0,
  receipt CHAR(32) NULL,
  dead TINYINT NOT NULL DEFAULT 0,
  dead_reason VARCHAR(500) NULL,
  created_at BIGINT NOT NULL,
  KEY idx_batchrun_queue_visible (dead, visible_at),
  KEY idx_batchrun_queue_receipt (receipt)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
-- name: migrate_0009_ledger
-- unless: table batchrun_ledger
-- The ledger (see common/ledger.sql): one row per (job, once_per period, entity).
CREATE TABLE IF NOT EXISTS batchrun_ledger (
  job VARCHAR(32) NOT NULL,
  once_key VARCHAR(10) NOT NULL,
  entity_id BIGINT UNSIGNED NOT NULL,
  period VARCHAR(10) NOT NULL,
  state TINYINT NOT NULL DEFAULT 0,
  attempts INT NOT NULL DEFAULT 0,
  owner CHAR(32) NULL,
  lease_until BIGINT NULL,
  queued TINYINT NOT NULL DEFAULT 0,
  last_error VARCHAR(500) NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (job, once_key, entity_id),
  KEY idx_batchrun_ledger_period_state (job, period, state),
  KEY idx_batchrun_ledger_owner (owner),
  KEY idx_batchrun_ledger_unqueued (state, queued)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0010_ledger_from_task
-- unless: recorded
-- unless: missing batchrun_task
-- Upgrade in place: the rows of the birthday-only ledger of batchrun 0.1 (batchrun_task,
-- keyed by job, year, user) become ledger rows keyed by the year; the old table stays.
INSERT IGNORE INTO batchrun_ledger
  (job, once_key, entity_id, period, state, attempts, owner, lease_until, queued,
   last_error, updated_at)
SELECT job, LPAD(year, 4, '0'), user_id, CONCAT(LPAD(year, 4, '0'), '-', LPAD(month, 2, '0')),
  state, attempts, owner, lease_until, queued, last_error, updated_at
FROM batchrun_task;

-- name: migrate_0020_suppression
-- unless: table batchrun_suppression
-- The suppression list (see common/suppression.sql). address is the normalised key: the
-- local part as given, '@', the domain lower-cased. Binary collation: the local part
-- compares exactly (RFC 5321 leaves its case to the receiving server), not the way the
-- database's default collation would (case- and accent-insensitive).
CREATE TABLE IF NOT EXISTS batchrun_suppression (
  address VARCHAR(254) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
  reason VARCHAR(16) NOT NULL,
  source VARCHAR(100) NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  CONSTRAINT chk_batchrun_suppression_reason
    CHECK (reason IN ('unsubscribe', 'bounce', 'complaint', 'manual'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: table_rows
-- The row estimate `db migrate --plan` shows (InnoDB's statistics, not a scan).
SELECT table_rows FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = :table;

-- name: threads_running
-- What --max-db-load compares with its limit.
SHOW GLOBAL STATUS LIKE 'Threads_running';

-- name: kill_query
-- Stops the statement of a connection batchrun gave up on (a cancel, its reply deadline):
-- the server would go on with it.
KILL QUERY :thread;

-- name: migrate_0030_run
-- unless: table batchrun_run
-- Run history (see common/history.sql): one row per run, retry drain, worker process,
-- Lambda invocation and events drain. Times are epoch ms on the server's clock; counts
-- is the run's JSON summary; job and period are NULL for a process serving every job.
CREATE TABLE IF NOT EXISTS batchrun_run (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  job VARCHAR(32) NULL,
  period VARCHAR(10) NULL,
  kind VARCHAR(8) NOT NULL,
  host VARCHAR(255) NOT NULL,
  pid INT NOT NULL,
  version VARCHAR(32) NOT NULL,
  started_at BIGINT NOT NULL,
  heartbeat_at BIGINT NOT NULL,
  ended_at BIGINT NULL,
  exit_code INT NULL,
  outcome VARCHAR(10) NOT NULL DEFAULT 'running',
  counts MEDIUMTEXT NULL,
  error VARCHAR(500) NULL,
  KEY idx_batchrun_run_job (job, id),
  KEY idx_batchrun_run_outcome (outcome)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0031_control
-- unless: table batchrun_control
-- Pause and cancel (see common/control.sql): one row per job and period ('' = every
-- period of the job). cancelled_at ends the runs going on at that time, not later ones.
CREATE TABLE IF NOT EXISTS batchrun_control (
  job VARCHAR(32) NOT NULL,
  period VARCHAR(10) NOT NULL DEFAULT '',
  paused TINYINT NOT NULL DEFAULT 0,
  reason VARCHAR(200) NULL,
  paused_at BIGINT NULL,
  cancelled_at BIGINT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (job, period)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0032_ledger_run_id
-- unless: column batchrun_ledger.run_id
-- The batchrun_run row that last claimed the entity (its step's run, for `why`). Online:
-- a NULL column without a default is instant on MariaDB 10.11, whatever the ledger's size.
ALTER TABLE batchrun_ledger ADD COLUMN run_id BIGINT UNSIGNED NULL, ALGORITHM=INSTANT;
-- name: migrate_0065_entity_task
-- unless: table batchrun_entity_task
-- Submitted tasks (see common/tasks.sql): one row per (job, task_key), run exactly once;
-- state 0 pending, 1 running, 2 succeeded, 3 failed (waits for another attempt), 4 dead.
CREATE TABLE IF NOT EXISTS batchrun_entity_task (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  job VARCHAR(32) NOT NULL,
  task_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  entity_id BIGINT UNSIGNED NOT NULL,
  data MEDIUMTEXT NOT NULL,
  state TINYINT NOT NULL DEFAULT 0,
  attempts INT NOT NULL DEFAULT 0,
  owner CHAR(32) NULL,
  lease_until BIGINT NULL,
  last_error VARCHAR(500) NULL,
  created_at BIGINT NOT NULL,
  started_at BIGINT NULL,
  finished_at BIGINT NULL,
  UNIQUE KEY uq_batchrun_entity_task_key (job, task_key),
  KEY idx_batchrun_entity_task_entity (job, entity_id, state, id),
  KEY idx_batchrun_entity_task_state (job, state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0066_entity_turn
-- unless: table batchrun_entity_turn
-- Whose turn it is to run one entity's tasks: a lease, held while one of them runs.
CREATE TABLE IF NOT EXISTS batchrun_entity_turn (
  job VARCHAR(32) NOT NULL,
  entity_id BIGINT UNSIGNED NOT NULL,
  owner CHAR(32) NULL,
  lease_until BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (job, entity_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0068_backend_slot
-- unless: table batchrun_backend_slot
-- Slots of shared backends (Backend(concurrency=N, shared=True), see common/backends.sql):
-- a lease per slot on the server's clock, held while a call runs.
CREATE TABLE IF NOT EXISTS batchrun_backend_slot (
  backend VARCHAR(32) NOT NULL,
  slot INT NOT NULL,
  owner CHAR(32) NULL,
  lease_until BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (backend, slot)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- name: migrate_0069_entity_task_resent_at
-- unless: column batchrun_entity_task.resent_at
-- When a task's message was last sent again because it looked lost (tasks/resend.py). A
-- NULL column without a default is instant on MariaDB 10.11.
ALTER TABLE batchrun_entity_task ADD COLUMN resent_at BIGINT NULL, ALGORITHM=INSTANT;

-- name: migrate_0070_entity_task_retry_at
-- unless: column batchrun_entity_task.retry_at
-- A failed task's next attempt starts no earlier than this (the database server's clock,
-- ms): a second message of the task (a duplicate delivery, one sent again) waits for it.
ALTER TABLE batchrun_entity_task ADD COLUMN retry_at BIGINT NULL, ALGORITHM=INSTANT;

-- name: migrate_0072_entity_task_run_id
-- unless: column batchrun_entity_task.run_id
-- The batchrun_run row (a worker, a Lambda invocation, a retry drain) that last started
-- the task: `why` names it. A NULL column without a default is instant on MariaDB 10.11.
ALTER TABLE batchrun_entity_task ADD COLUMN run_id BIGINT UNSIGNED NULL, ALGORITHM=INSTANT;

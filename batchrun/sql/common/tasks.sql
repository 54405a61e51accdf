-- Submitted tasks (batchrun_entity_task) and whose turn it is per entity
-- (batchrun_entity_turn); each dialect's tasks.sql holds its inserts that ignore a key
-- already there. States: 0 pending, 1 running, 2 succeeded, 3 failed, 4 dead.

-- name: task_get
SELECT id, entity_id, data, state, attempts, owner, lease_until, retry_at
FROM batchrun_entity_task WHERE job = :job AND task_key = :key;

-- name: task_first_unfinished
-- The entity's oldest task not finished: the only one whose turn it can be.
SELECT task_key FROM batchrun_entity_task
WHERE job = :job AND entity_id = :entity_id AND state IN (0, 1, 3)
ORDER BY id LIMIT 1;

-- name: task_start
-- Not before a failed task's retry_at: a second message of it waits. Once started, the
-- retry time is spent. :run is the batchrun_run row of the process (NULL without one).
UPDATE batchrun_entity_task
SET state = 1, owner = :me, lease_until = :until, started_at = :now, retry_at = NULL,
  run_id = :run
WHERE id = :id AND (state IN (0, 3) OR (state = 1 AND lease_until < :now))
  AND (retry_at IS NULL OR retry_at <= :now);

-- name: task_finish
-- Fenced: a run whose lease was taken over records nothing. :retry_at (server ms, or
-- NULL) is when a failed task may start again.
UPDATE batchrun_entity_task
SET state = :state, attempts = attempts + 1, owner = NULL, lease_until = NULL,
  last_error = :error, finished_at = :now, retry_at = :retry_at
WHERE id = :id AND owner = :me AND state = 1;

-- name: task_release
-- Given back unattempted: pending (3, waiting for a retry, once it has failed before).
UPDATE batchrun_entity_task
SET state = CASE WHEN attempts > 0 THEN 3 ELSE 0 END, owner = NULL, lease_until = NULL
WHERE id = :id AND owner = :me AND state = 1;

-- name: task_claim_resend
-- A pending task no process ever started, submitted before :cutoff and not sent again
-- since: its message looks lost, and this process sends it again (tasks/resend.py). One
-- process a period wins the row.
UPDATE batchrun_entity_task SET resent_at = :now
WHERE job = :job AND task_key = :key AND state = 0 AND started_at IS NULL
  AND created_at < :cutoff AND (resent_at IS NULL OR resent_at < :cutoff);

-- name: task_unclaim_resend
-- The resend's message could not be sent: the next look may try again at once.
UPDATE batchrun_entity_task SET resent_at = NULL
WHERE job = :job AND task_key = :key AND resent_at = :now;

-- name: task_lost_firsts
-- Of these entities, the oldest unfinished tasks that look lost (as task_claim_resend
-- tells it) and have been their entity's oldest since before :cutoff (no task of the
-- entity ended since): what their later tasks wait behind. One aggregate a batch, as
-- task_first_unfinished_many.
SELECT t.entity_id, t.task_key
FROM batchrun_entity_task t
JOIN (
  SELECT entity_id, MIN(CASE WHEN state IN (0, 1, 3) THEN id END) AS first_id,
    MAX(finished_at) AS last_end
  FROM batchrun_entity_task
  WHERE job = :job AND entity_id IN :ids*
  GROUP BY entity_id
) f ON t.id = f.first_id
WHERE t.state = 0 AND t.started_at IS NULL AND t.created_at < :cutoff
  AND (t.resent_at IS NULL OR t.resent_at < :cutoff)
  AND (f.last_end IS NULL OR f.last_end < :cutoff);

-- name: task_unstarted_slice
-- The job's next :limit tasks no process ever started, after id :after in id order, each
-- with whether it looks lost (as task_claim_resend tells it): the slice an empty queue's
-- sweep reads (tasks/sweep.py). Read through an index of unstarted pending tasks in id
-- order (MariaDB's (job, state) one; a partial one on PostgreSQL and SQLite).
SELECT t.id, t.entity_id, t.task_key,
  CASE WHEN t.created_at < :cutoff AND (t.resent_at IS NULL OR t.resent_at < :cutoff)
    THEN 1 ELSE 0 END
FROM (
  SELECT id FROM batchrun_entity_task
  WHERE job = :job AND state = 0 AND started_at IS NULL AND id > :after
  ORDER BY id
  LIMIT :limit
) slice
JOIN batchrun_entity_task t ON t.id = slice.id
ORDER BY t.id;

-- name: task_extend
UPDATE batchrun_entity_task SET lease_until = :until WHERE id = :id AND owner = :me;

-- name: turn_take
UPDATE batchrun_entity_turn SET owner = :me, lease_until = :until
WHERE job = :job AND entity_id = :entity_id
  AND (owner IS NULL OR owner = :me OR lease_until < :now);

-- name: turn_extend
UPDATE batchrun_entity_turn SET lease_until = :until
WHERE job = :job AND entity_id = :entity_id AND owner = :me;

-- name: turn_release
UPDATE batchrun_entity_turn SET owner = NULL, lease_until = 0
WHERE job = :job AND entity_id = :entity_id AND owner = :me;

-- name: task_counts
-- For `status TASKJOB`: tasks per state, the oldest pending one's submission time, and of
-- the running ones those whose lease passed (their process died: the task runs again once
-- its message comes back).
SELECT state, COUNT(*), MIN(created_at),
  SUM(CASE WHEN state = 1 AND lease_until < :now THEN 1 ELSE 0 END)
FROM batchrun_entity_task
WHERE job = :job GROUP BY state;

-- A batch of messages claims its entities' first tasks in a few statements, whatever
-- its size (pipeline/task_claim.py): the same conditions as the one-task statements.

-- name: task_submitted_many
-- What a resubmission of these keys must know (tasks/submit.py): each one's entity, whether
-- it was ever started (one never started may look lost) and when it was submitted.
SELECT task_key, entity_id, CASE WHEN state = 0 AND started_at IS NULL THEN 1 ELSE 0 END,
  created_at
FROM batchrun_entity_task WHERE job = :job AND task_key IN :keys*;

-- name: task_get_many
SELECT id, entity_id, data, state, attempts, task_key, retry_at
FROM batchrun_entity_task WHERE job = :job AND task_key IN :keys*;

-- name: turn_take_many
UPDATE batchrun_entity_turn SET owner = :me, lease_until = :until
WHERE job = :job AND entity_id IN :ids*
  AND (owner IS NULL OR owner = :me OR lease_until < :now);

-- name: turn_mine
SELECT entity_id FROM batchrun_entity_turn
WHERE job = :job AND entity_id IN :ids* AND owner = :me;

-- name: task_first_unfinished_many
-- Each entity's oldest task not finished (its id): the only one whose turn it can be.
SELECT entity_id, MIN(id) FROM batchrun_entity_task
WHERE job = :job AND entity_id IN :ids* AND state IN (0, 1, 3)
GROUP BY entity_id;

-- name: task_start_many
UPDATE batchrun_entity_task
SET state = 1, owner = :me, lease_until = :until, started_at = :now, retry_at = NULL,
  run_id = :run
WHERE id IN :ids* AND (state IN (0, 3) OR (state = 1 AND lease_until < :now))
  AND (retry_at IS NULL OR retry_at <= :now);

-- name: task_mine
SELECT id FROM batchrun_entity_task WHERE id IN :ids* AND owner = :me AND state = 1;

-- name: task_finish_many
-- task_finish for tasks that ended alike without an error message or a retry time.
UPDATE batchrun_entity_task
SET state = :state, attempts = attempts + 1, owner = NULL, lease_until = NULL,
  last_error = NULL, finished_at = :now, retry_at = NULL
WHERE id IN :ids* AND owner = :me AND state = 1;

-- name: task_finished_at
-- After task_finish_many changed fewer rows than it named: the ones it did finish.
SELECT id FROM batchrun_entity_task
WHERE id IN :ids* AND state = :state AND finished_at = :now AND owner IS NULL;

-- name: turn_release_many
UPDATE batchrun_entity_turn SET owner = NULL, lease_until = 0
WHERE job = :job AND entity_id IN :ids* AND owner = :me;

-- name: task_revive
-- Dead tasks whose dead letters are redriven: pending again, their attempts from zero,
-- so the message put back runs them (each its entity's oldest unfinished task again).
UPDATE batchrun_entity_task
SET state = 0, attempts = 0, retry_at = NULL, owner = NULL, lease_until = NULL
WHERE job = :job AND task_key IN :keys* AND state = 4;

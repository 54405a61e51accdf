-- name: has_column
SELECT COUNT(*) FROM information_schema.columns
WHERE table_schema = DATABASE() AND table_name = :table AND column_name = :item;

-- name: has_table
SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = :table AND :item = '';

-- name: has_index
SELECT COUNT(*) FROM information_schema.statistics
WHERE table_schema = DATABASE() AND table_name = :table AND index_name = :item;

-- name: has_unique
-- A single-column unique index on the column, whatever its name.
SELECT COUNT(*) FROM information_schema.statistics s
WHERE s.table_schema = DATABASE() AND s.table_name = :table AND s.column_name = :item
  AND s.non_unique = 0 AND s.seq_in_index = 1
  AND NOT EXISTS (
    SELECT 1 FROM information_schema.statistics s2
    WHERE s2.table_schema = s.table_schema AND s2.table_name = s.table_name
      AND s2.index_name = s.index_name AND s2.seq_in_index = 2
  );

-- name: schema_record
INSERT IGNORE INTO batchrun_schema (step, applied_at) VALUES (:step, :now);

-- name: explain_prefix
EXPLAIN

-- name: list_tables
SELECT table_name FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE';

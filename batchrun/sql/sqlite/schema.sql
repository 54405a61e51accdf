-- name: has_column
SELECT COUNT(*) FROM pragma_table_xinfo(:table) WHERE name = :item;

-- name: has_table
SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = :table AND :item = '';

-- name: has_index
SELECT COUNT(*) FROM pragma_index_list(:table) WHERE name = :item;

-- name: has_unique
-- A single-column unique index on the column, whatever its name.
SELECT COUNT(*) FROM pragma_index_list(:table) il
WHERE il."unique" = 1
  AND (SELECT COUNT(*) FROM pragma_index_info(il.name)) = 1
  AND (SELECT name FROM pragma_index_info(il.name)) = :item;

-- name: schema_record
INSERT OR IGNORE INTO batchrun_schema (step, applied_at) VALUES (:step, :now);

-- name: explain_prefix
EXPLAIN QUERY PLAN

-- name: pragma_wal
-- Run by `batchrun db migrate` only: the mode is kept in the file, so later opens need
-- not write it again (and a dry run must not).
PRAGMA journal_mode = WAL;

-- name: pragma_synchronous
PRAGMA synchronous = NORMAL;

-- name: list_tables
SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%';

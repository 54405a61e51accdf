-- Catalog lookups for the migration guards. A table is the one its name resolves to through
-- the search_path (to_regclass), as every query of batchrun's and the job's finds it: a
-- schema named after the role ("$user", first on the default path) that holds none of
-- them does not make migrate create empty copies there. The catalogs show every table,
-- privileges or not: a role that may not read one is told so by the query, not sent to
-- `batchrun db migrate`.

-- name: has_column
SELECT COUNT(*) FROM pg_attribute
WHERE attrelid = to_regclass(quote_ident(:table)) AND attname = :item
  AND attnum > 0 AND NOT attisdropped;

-- name: has_table
SELECT COUNT(*) FROM pg_class
WHERE oid = to_regclass(quote_ident(:table)) AND relkind IN ('r', 'p', 'v', 'm', 'f')
  AND CAST(:item AS text) = '';

-- name: has_index
-- Only a VALID index counts: an interrupted CREATE INDEX CONCURRENTLY leaves an INVALID
-- one behind, which the step then drops and builds again.
SELECT COUNT(*) FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_class tc ON tc.oid = i.indrelid
WHERE tc.oid = to_regclass(quote_ident(:table)) AND ic.relname = :item AND i.indisvalid;

-- name: has_unique
-- A valid single-column unique index on the column, whatever its name.
SELECT COUNT(*) FROM pg_index i
JOIN pg_class tc ON tc.oid = i.indrelid
JOIN pg_attribute a ON a.attrelid = tc.oid AND a.attnum = i.indkey[0]
WHERE tc.oid = to_regclass(quote_ident(:table)) AND a.attname = :item
  AND i.indisunique AND i.indisvalid AND i.indnatts = 1 AND i.indpred IS NULL;

-- name: schema_record
INSERT INTO batchrun_schema (step, applied_at) VALUES (:step, :now) ON CONFLICT DO NOTHING;

-- name: explain_prefix
EXPLAIN

-- name: list_tables
-- The tables an unqualified name finds (pg_table_is_visible: first on the search_path),
-- the system's own left out.
SELECT c.relname FROM pg_class c
WHERE c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid)
  AND c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace);

-- name: table_rows
-- The row estimate `db migrate --plan` shows (the planner's statistics, not a scan; -1
-- until the table was first vacuumed or analyzed).
SELECT CAST(reltuples AS bigint) FROM pg_class
WHERE oid = to_regclass(quote_ident(:table)) AND relkind IN ('r', 'p');

-- name: threads_running
-- What --max-db-load compares with its limit: statements the server is executing now
-- (client backends, this one included, as MariaDB's Threads_running counts itself).
SELECT 'Threads_running', COUNT(*) FROM pg_stat_activity
WHERE state = 'active' AND backend_type = 'client backend';

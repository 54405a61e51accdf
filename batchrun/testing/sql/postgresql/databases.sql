-- batchrun.testing's temporary databases on a PostgreSQL server. {name} is a name the kit
-- generates (batchrun_test_ and hex digits), never a value from outside.

-- name: create_database
CREATE DATABASE "{name}";

-- name: drop_database
DROP DATABASE IF EXISTS "{name}" WITH (FORCE);

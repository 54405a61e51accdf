-- batchrun.testing's temporary databases on a MySQL/MariaDB server. {name} is a name the
-- kit generates (batchrun_test_ and hex digits), never a value from outside.

-- name: create_database
CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;

-- name: drop_database
DROP DATABASE IF EXISTS `{name}`;

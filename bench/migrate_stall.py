"""How long `batchrun db migrate` makes an application writer wait (MariaDB).

A fresh database gets a seed-shaped ``user`` table of ``--rows`` rows (INSERT ... SELECT
from the sequence engine's ``seq_1_to_N``: seconds, not minutes). An application writer
then runs in a thread on its own autocommit pymysql connection: one UPDATE of a random
user and one INSERT of a new one per loop, about 100 loops a second. While it runs, the
migration runs as a real subprocess, and every statement's wait is recorded; the report
is the longest one (and the 99th percentile) while the migration ran.

Migrations measured:

- ``online``: ``batchrun db migrate`` as it is (a VIRTUAL ``birth_month``, ALGORITHM=INSTANT;
  its index ALGORITHM=INPLACE, LOCK=NONE);
- ``stored`` (``--stored``): the earlier migration, run by hand the same way: a STORED
  ``birth_month`` (a table copy under a write lock), then the same index.

    python -m bench.migrate_stall --rows 2000000 --stored --json bench/migrate-stall.json

``tests/adapters/test_online_migrate.py`` uses the same harness at 200,000 rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pymysql

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("BATCHRUN_TEST_MYSQL_URL", "mysql://root:@127.0.0.1:3306/")
# The seed's `user` table (the birthday job's migrate_0001_user) before batchrun's steps.
USER_TABLE = """CREATE TABLE `user` (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  first_name VARCHAR(255) NULL,
  last_name VARCHAR(255) NULL,
  email VARCHAR(255) NULL,
  date_of_birth DATE NULL,
  status SMALLINT NOT NULL DEFAULT 10
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"""
# Birthdays spread over 1950-2004 (20,000 days), one user in twenty inactive.
SEED = """INSERT INTO `user` (first_name, last_name, email, date_of_birth, status)
SELECT CONCAT('First', seq), CONCAT('Last', seq), CONCAT('user', seq, '@example.com'),
  DATE_ADD('1950-01-01', INTERVAL (seq * 7919) % 20000 DAY), IF(seq % 20 = 0, 0, 10)
FROM seq_1_to_{rows}"""
# The migration batchrun ran before it went online: a STORED column copies the table.
STORED = (
    "ALTER TABLE `user` ADD COLUMN birth_month TINYINT AS (MONTH(date_of_birth)) STORED",
    "ALTER TABLE `user` ADD INDEX idx_user_birth_month_status_id (birth_month, status, id)",
)


def connect(url: str) -> pymysql.connections.Connection[Any]:
    """An autocommit pymysql connection to ``url`` (its path names the database)."""
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=parts.path.lstrip("/") or None,
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=5,
    )


def create_database(server: str = SERVER) -> str:
    """A fresh database on ``server``; its URL."""
    name = f"batchrun_stall_{uuid.uuid4().hex[:10]}"
    conn = connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    parts = urlsplit(server)
    return f"mysql://{parts.netloc}/{name}"


def drop_database(url: str) -> None:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{urlsplit(url).path.lstrip('/')}`")
    finally:
        conn.close()


def seed_user_table(url: str, rows: int) -> float:
    """Create the seed-shaped ``user`` table with ``rows`` rows; the seconds it took."""
    started = time.monotonic()
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(USER_TABLE)
            cur.execute(SEED.format(rows=int(rows)))
            cur.execute("ANALYZE TABLE `user`")
            cur.fetchall()
    finally:
        conn.close()
    return time.monotonic() - started


@dataclass
class Waits:
    """Every writer statement's wait (seconds), with when it started."""

    samples: list[tuple[float, float]] = field(default_factory=list)  # (started, wait)
    errors: list[str] = field(default_factory=list)

    def during(self, start: float, end: float) -> list[float]:
        """The waits of the statements running at any time in [start, end]."""
        return [w for t, w in self.samples if t <= end and t + w >= start]


class Writer(threading.Thread):
    """The application: autocommit, one UPDATE and one INSERT a loop, ``rate`` loops/s."""

    def __init__(self, url: str, *, rate: float = 100.0, max_id: int) -> None:
        super().__init__(daemon=True, name="app-writer")
        self.url = url
        self.rate = rate
        self.max_id = max_id
        self.waits = Waits()
        self.loops = 0
        self._halt = threading.Event()
        self._conn = connect(url)

    def run(self) -> None:
        rng = random.Random(7)
        period = 1.0 / self.rate
        next_at = time.monotonic()
        with self._conn.cursor() as cur:
            while not self._halt.is_set():
                for sql, args in (
                    (
                        "UPDATE `user` SET first_name = %s WHERE id = %s",
                        (f"Renamed{self.loops}", rng.randint(1, self.max_id)),
                    ),
                    (
                        "INSERT INTO `user` (first_name, last_name, email, date_of_birth, "
                        "status) VALUES (%s, %s, %s, %s, 10)",
                        ("New", f"User{self.loops}", f"new{self.loops}@example.com", "1990-06-15"),
                    ),
                ):
                    started = time.monotonic()
                    try:
                        cur.execute(sql, args)
                    except pymysql.err.MySQLError as exc:
                        self.waits.errors.append(str(exc))
                    self.waits.samples.append((started, time.monotonic() - started))
                self.loops += 1
                next_at += period
                pause = next_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                else:
                    next_at = time.monotonic()  # behind: do not burst to catch up

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        self._conn.close()


def run_migration(url: str, kind: str) -> tuple[float, str]:
    """Run the ``online`` (``batchrun db migrate``) or ``stored`` migration; (seconds,
    what it printed)."""
    started = time.monotonic()
    if kind == "online":
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        env["BATCHRUN_DB"] = url
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        done = subprocess.run(
            [sys.executable, "-m", "batchrun", "db", "migrate"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"db migrate failed ({done.returncode}): {done.stderr.strip()}")
        return time.monotonic() - started, done.stderr.strip()
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            for sql in STORED:
                cur.execute(sql)
    finally:
        conn.close()
    return time.monotonic() - started, "; ".join(STORED)


@dataclass
class Stall:
    """One measurement: the longest writer wait while the migration ran."""

    migration: str
    rows: int
    seed_s: float
    migrate_s: float
    max_wait_s: float
    p99_wait_s: float
    writes_during: int
    writer_errors: int
    output: str = ""


def measure(rows: int, kind: str = "online", *, rate: float = 100.0) -> Stall:
    """Seed a fresh database, run ``kind`` under the writer, drop the database."""
    url = create_database()
    try:
        seed_s = seed_user_table(url, rows)
        writer = Writer(url, rate=rate, max_id=rows)
        writer.start()
        try:
            time.sleep(0.5)  # the writer is in its stride before the migration starts
            start = time.monotonic()
            migrate_s, output = run_migration(url, kind)
            end = time.monotonic()
            time.sleep(0.5)  # a wait that started during the migration ends, and counts
        finally:
            writer.stop()
        waits = writer.waits.during(start, end)
        ordered = sorted(waits)
        return Stall(
            migration=kind,
            rows=rows,
            seed_s=round(seed_s, 2),
            migrate_s=round(migrate_s, 2),
            max_wait_s=round(max(waits, default=0.0), 3),
            p99_wait_s=round(ordered[int(len(ordered) * 0.99)] if ordered else 0.0, 3),
            writes_during=len(waits),
            writer_errors=len(writer.waits.errors),
            output=output,
        )
    finally:
        drop_database(url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows in `user`")
    parser.add_argument(
        "--stored", action="store_true", help="also measure the earlier STORED-column migration"
    )
    parser.add_argument("--rate", type=float, default=100.0, help="writer loops per second")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    kinds = ["online", "stored"] if args.stored else ["online"]
    results = []
    for kind in kinds:
        stall = measure(args.rows, kind, rate=args.rate)
        results.append(stall)
        print(
            f"{kind:>6}  {stall.rows:>10,} rows  migrate {stall.migrate_s:7.2f} s  "
            f"max writer wait {stall.max_wait_s:7.3f} s  p99 {stall.p99_wait_s:6.3f} s  "
            f"({stall.writes_during} writes during, {stall.writer_errors} errors; "
            f"seed {stall.seed_s:.1f} s)",
            flush=True,
        )
    if args.json is not None:
        data = {"server": "MariaDB", "results": [asdict(s) for s in results]}
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0 if statistics.fmean([s.writer_errors for s in results]) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

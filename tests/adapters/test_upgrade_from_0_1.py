"""Upgrading from batchrun 0.1: a database made and run by 0.1, migrated, then run again.

The database is built from 0.1's own schema (``tests/support/legacy/0.1/<dialect>.sql``, its
migrations.sql copied unchanged) and holds what a 0.1 run of June 2025 leaves behind: most
users sent, four waiting for a retry (three with a v1 message on the queue, one whose
message 0.1 could not queue), one failed for good and dead-lettered, one skipped for an
invalid address, a stale v1 continuation, and a few rows of June 2024. After ``batchrun db
migrate`` the ledger holds every old row; a rerun of the finished month creates and sends
nothing new, and the users waiting for a retry end with exactly one email each, under the
Message-ID 0.1 gave them.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any

import pytest
from support import ROOT, SUPPORT
from support.birthday import card_counts
from support.cli import run_cli
from support.db import mysql_connect, query, table_digest
from support.smtp_server import SmtpTestServer

from batchrun.db.sqlite import sqlite_path
from batchrun.jobs.birthday.codes import display

LEGACY = SUPPORT / "legacy" / "0.1"
SENDER = "birthday@example.com"

# 0.1's own columns of the application tables (birth_month and idempotency_key included).
USER_COLUMNS = "id, first_name, last_name, email, date_of_birth, status, birth_month"
CARD_COLUMNS = "id, recipient_email, message, status, scheduled_at, gift_code, idempotency_key"
TASK_COLUMNS = (
    "job, year, user_id, month, state, attempts, owner, lease_until, queued, last_error, updated_at"
)
LEDGER_COLUMNS = (
    "job, once_key, entity_id, period, state, attempts, owner, lease_until, queued, last_error, "
    "updated_at"
)
QUEUE_COLUMNS = "id, body, visible_at, receive_count, receipt, dead, dead_reason, created_at"

# The 0.1 run of June 2025. Users 1..20 are born in June, active, with an address.
JUNE = range(1, 21)
RETRYING = {5: 1, 11: 1, 17: 2, 19: 1}  # user -> attempts so far (17 was retried once)
UNQUEUED = 19  # 0.1 could not queue its retry (queue unreachable): it waits in the ledger
FAILED = 8
SKIPPED = 13  # its address is not one
SENT = sorted(set(JUNE) - set(RETRYING) - {FAILED, SKIPPED})
SENT_2024 = (1, 2, 3)
INACTIVE, NO_EMAIL, OTHER_MONTHS = 21, 22, (23, 24)
TEMPORARY = "451 4.3.0 Try again later"
PERMANENT = "550 5.1.1 No such user"
INVALID = "invalid email address"
STALE_RECEIPT = "5d41402abc4b2a76b9719d911017c592"

# What 0.1's `batchrun db migrate` recorded on an empty database: every step but, on MySQL,
# the index step its birth_month step had already done (its guard held).
LEGACY_STEPS = {
    "mysql": [f"migrate_{n:04d}" for n in range(9) if n != 4],
    "sqlite": [f"migrate_{n:04d}" for n in range(15)],
}


def dialect_of(db_url: str) -> str:
    return "sqlite" if db_url.startswith("sqlite") else "mysql"


class LegacyDb:
    """One synchronous autocommit connection, written with ``%s`` placeholders."""

    def __init__(self, db_url: str) -> None:
        self.sqlite = dialect_of(db_url) == "sqlite"
        if self.sqlite:
            self.conn: Any = sqlite3.connect(sqlite_path(db_url), isolation_level=None)
            self.conn.execute("PRAGMA journal_mode = WAL")  # as 0.1 opened every database
        else:
            self.conn = mysql_connect(db_url)

    def _sql(self, sql: str) -> str:
        return sql.replace("%s", "?") if self.sqlite else sql

    def run(self, sql: str, *args: Any) -> None:
        if self.sqlite:
            self.conn.execute(self._sql(sql) if args else sql, args)
        else:
            with self.conn.cursor() as cur:
                cur.execute(sql, args or None)

    def many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if self.sqlite:
            self.conn.executemany(self._sql(sql), rows)
        else:
            with self.conn.cursor() as cur:
                cur.executemany(sql, rows)

    def value(self, sql: str, *args: Any) -> Any:
        if self.sqlite:
            row = self.conn.execute(self._sql(sql), args).fetchone()
        else:
            with self.conn.cursor() as cur:
                cur.execute(sql, args or None)
                row = cur.fetchone()
        return row[0] if row else None

    def close(self) -> None:
        self.conn.close()


@contextmanager
def legacy_db(db_url: str) -> Iterator[LegacyDb]:
    db = LegacyDb(db_url)
    try:
        yield db
    finally:
        db.close()


# -- 0.1's schema, applied as 0.1 applied it -----------------------------------------------

GUARDS = {
    # 0.1's guards (its sql/<dialect>/schema.sql), by kind and dialect: (table, item) -> count.
    "sqlite": {
        "table": "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = %s "
        "AND %s = ''",
        "column": "SELECT COUNT(*) FROM pragma_table_xinfo(%s) WHERE name = %s",
        "index": "SELECT COUNT(*) FROM pragma_index_list(%s) WHERE name = %s",
        "unique": 'SELECT COUNT(*) FROM pragma_index_list(%s) il WHERE il."unique" = 1 '
        "AND (SELECT COUNT(*) FROM pragma_index_info(il.name)) = 1 "
        "AND (SELECT name FROM pragma_index_info(il.name)) = %s",
    },
    "mysql": {
        "table": "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = "
        "DATABASE() AND table_name = %s AND %s = ''",
        "column": "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = "
        "DATABASE() AND table_name = %s AND column_name = %s",
        "index": "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = "
        "DATABASE() AND table_name = %s AND index_name = %s",
        "unique": "SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = "
        "DATABASE() AND s.table_name = %s AND s.column_name = %s AND s.non_unique = 0 "
        "AND s.seq_in_index = 1 AND NOT EXISTS (SELECT 1 FROM information_schema.statistics s2 "
        "WHERE s2.table_schema = s.table_schema AND s2.table_name = s.table_name "
        "AND s2.index_name = s.index_name AND s2.seq_in_index = 2)",
    },
}


def legacy_steps(dialect: str) -> list[tuple[str, list[str], str]]:
    """(name, guards, statement) of each step in 0.1's migrations.sql, in name order."""
    text = (LEGACY / f"{dialect}.sql").read_text()
    blocks = re.split(r"^--\s*name:\s*(\S+)\s*$", text, flags=re.MULTILINE)[1:]
    steps = []
    for name, body in zip(blocks[::2], blocks[1::2], strict=True):
        guards = re.findall(r"^--\s*unless:\s*(.+?)\s*$", body, flags=re.MULTILINE)
        steps.append((name, guards, body.strip()))
    return sorted(steps)


def create_legacy_schema(db_url: str, now: int) -> list[str]:
    """Run 0.1's migrate: each step whose guards do not hold, recorded in batchrun_schema."""
    dialect = dialect_of(db_url)
    applied = []
    with legacy_db(db_url) as db:
        for name, guards, statement in legacy_steps(dialect):
            held = False
            for guard in guards:
                kind, _, target = guard.partition(" ")
                table, _, item = target.partition(".")
                held = held or bool(db.value(GUARDS[dialect][kind], table, item))
            if held:
                continue
            db.run(statement)
            db.run("INSERT INTO batchrun_schema (step, applied_at) VALUES (%s, %s)", name, now)
            applied.append(name)
    return applied


# -- what a 0.1 run left behind ------------------------------------------------------------


def v1_retry(uid: int, reason: str) -> str:
    """A retry body exactly as 0.1's QueueMessage.to_json wrote it."""
    body = {"v": 1, "kind": "retry", "job": "birthday", "month": "2025-06"}
    body.update(user_id=uid, attempt=1, reason=reason)
    return json.dumps(body, separators=(",", ":"))


def v1_continuation(after_id: int, until_id: int) -> str:
    body = {"v": 1, "kind": "continuation", "job": "birthday", "month": "2025-06"}
    body.update(after_id=after_id, until_id=until_id)
    return json.dumps(body, separators=(",", ":"))


def code_of(year: int, uid: int) -> str:
    return f"{year}{uid:012d}"  # 16 Crockford symbols, as 0.1's codes were


def birthday_card(year: int, uid: int) -> tuple[Any, ...]:
    """A card as 0.1's ensure_cards inserted it, keyed ``birthday:YEAR:ID``."""
    scheduled = f"{year}-06-01 00:00:00"
    email = f"user{uid}@example.org"
    return (email, "Happy birthday!", 1, scheduled, code_of(year, uid), f"birthday:{year}:{uid}")


def write_legacy_run(db_url: str, t0: int) -> None:
    """Users, cards, ledger and queue as 0.1 left them after June 2025 (and June 2024)."""
    users = []
    for uid in range(1, 25):
        first, last = ("Zoë", "O'Brien") if uid == 2 else (f"First{uid}", f"Last{uid}")
        email = {SKIPPED: "not-an-address", NO_EMAIL: None}.get(uid, f"user{uid}@example.org")
        other = dict(zip(OTHER_MONTHS, (date(1990, 7, 4), date(1991, 12, 31)), strict=True))
        born = other.get(uid, date(1970 + uid, 6, uid))
        status = 0 if uid == INACTIVE else 10
        users.append((uid, first, last, email, born.isoformat(), status))
    cards: list[tuple[Any, ...]] = [
        # The application's own cards, from before batchrun: no idempotency key.
        ("user4@example.org", "From the team", 1, "2024-12-24 00:00:00", "APP0000000000001", None),
        ("user9@example.org", "From the team", 1, "2024-12-24 00:00:00", "APP0000000000002", None),
    ]
    cards += [birthday_card(2024, uid) for uid in SENT_2024]
    # 0.1 created the card before sending: every user it tried has one, the skipped has none.
    cards += [birthday_card(2025, uid) for uid in sorted([*SENT, *RETRYING, FAILED])]
    t2024 = t0 - 365 * 86_400_000
    tasks: list[tuple[Any, ...]] = [
        ("birthday", 2024, uid, 6, 1, 1, None, None, 0, None, t2024) for uid in SENT_2024
    ]
    tasks += [("birthday", 2025, uid, 6, 1, 1, None, None, 0, None, t0) for uid in SENT]
    for uid, attempts in RETRYING.items():
        queued = int(uid != UNQUEUED)
        tasks.append(
            ("birthday", 2025, uid, 6, 3, attempts, None, None, queued, TEMPORARY, t0 + attempts)
        )
    tasks.append(("birthday", 2025, FAILED, 6, 4, 1, None, None, 1, PERMANENT, t0))
    tasks.append(("birthday", 2025, SKIPPED, 6, 2, 1, None, None, 0, INVALID, t0))
    messages: list[tuple[Any, ...]] = [
        (v1_retry(FAILED, PERMANENT), t0, 0, None, 1, PERMANENT, t0),  # send_dead
        (v1_retry(5, TEMPORARY), t0, 0, None, 0, None, t0),
        (v1_retry(11, TEMPORARY), t0, 0, None, 0, None, t0),
        # Received once by a 0.1 `batchrun retry`, failed again, hidden for a backoff since.
        (v1_retry(17, TEMPORARY), t0 + 60_000, 1, STALE_RECEIPT, 0, None, t0),
        # A stopped 0.1 run handed on (10, 20]; the month was finished by a rerun since.
        (v1_continuation(10, 20), t0, 0, None, 0, None, t0),
    ]
    with legacy_db(db_url) as db:
        db.many(
            "INSERT INTO user (id, first_name, last_name, email, date_of_birth, status) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            users,
        )
        db.many(
            "INSERT INTO gift_card (recipient_email, message, status, scheduled_at, gift_code, "
            "idempotency_key) VALUES (%s, %s, %s, %s, %s, %s)",
            cards,
        )
        db.many(
            f"INSERT INTO batchrun_task ({TASK_COLUMNS}) VALUES ({', '.join(['%s'] * 11)})", tasks
        )
        db.many(
            "INSERT INTO batchrun_queue (body, visible_at, receive_count, receipt, dead, "
            "dead_reason, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            messages,
        )


# -- observations --------------------------------------------------------------------------


def app_rows(db_url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The application tables' rows, 0.1's columns selected by name."""
    return (
        query(db_url, f"SELECT {USER_COLUMNS} FROM user ORDER BY id"),
        query(db_url, f"SELECT {CARD_COLUMNS} FROM gift_card ORDER BY id"),
    )


def ledger(db_url: str) -> dict[tuple[str, str, int], tuple[Any, ...]]:
    """(job, once_key, entity) -> (period, state, attempts, owner, lease, queued, error, at)."""
    rows = query(db_url, f"SELECT {LEDGER_COLUMNS} FROM batchrun_ledger")
    return {
        (str(r[0]), str(r[1]), int(r[2])): (
            str(r[3]),
            int(r[4]),
            int(r[5]),
            r[6],
            r[7],
            int(r[8]),
            r[9],
            int(r[10]),
        )
        for r in rows
    }


def ledger_from_task(db_url: str) -> dict[tuple[str, str, int], tuple[Any, ...]]:
    """What the ledger must hold for every batchrun_task row: the same row, keyed by year."""
    rows = query(db_url, f"SELECT {TASK_COLUMNS} FROM batchrun_task")
    return {
        (str(r[0]), f"{int(r[1]):04d}", int(r[2])): (
            f"{int(r[1]):04d}-{int(r[3]):02d}",
            int(r[4]),
            int(r[5]),
            r[6],
            r[7],
            int(r[8]),
            r[9],
            int(r[10]),
        )
        for r in rows
    }


def schema(db_url: str) -> list[tuple[Any, ...]]:
    if dialect_of(db_url) == "sqlite":
        return query(db_url, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
    names = sorted(str(r[0]) for r in query(db_url, "SHOW TABLES"))
    return [query(db_url, f"SHOW CREATE TABLE `{name}`")[0] for name in names]


def cli(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """(exit code, the --json object if one was printed, stderr)."""
    result = run_cli(*args, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    data = json.loads(result.stdout) if "--json" in args and result.stdout.strip() else None
    return result.returncode, data, result.stdout + result.stderr


def status(env: dict[str, str]) -> dict[str, Any]:
    code, data, output = cli(env, "status", "--month", "2025-06", "--json")
    assert code == 0 and data is not None, output
    return data


def rerun(env: dict[str, str]) -> dict[str, Any]:
    code, data, output = cli(env, "birthday", "--month", "2025-06", "--json")
    assert code == 0 and data is not None, output
    assert data["failed"] == data["skipped"] == data["queued_for_retry"] == 0, data
    assert data["dead_lettered"] == data["cards_created"] == 0, data  # no card, ever
    return data


def retry(env: dict[str, str]) -> dict[str, Any]:
    code, data, output = cli(env, "retry", "--json")
    assert code == 0 and data is not None, output
    assert data["failed"] == data["dead_lettered"] == 0, data  # no v1 message was poison
    assert data["remaining"] == 0, data
    return data


# -- the upgrade ---------------------------------------------------------------------------


# batchrun 0.1 ran on MySQL and SQLite only: on PostgreSQL there is nothing to upgrade from.
@pytest.mark.parametrize("db_url", ["sqlite", "mysql"], indirect=True)
@pytest.mark.parametrize("order", ["retry_first", "rerun_first"])
def test_upgrade_from_0_1(db_url: str, smtp_server: SmtpTestServer, order: str) -> None:
    t0 = int(time.time() * 1000) - 3_600_000  # the 0.1 run, an hour ago
    applied = create_legacy_schema(db_url, t0 - 1000)
    assert [name[: len("migrate_0000")] for name in applied] == LEGACY_STEPS[dialect_of(db_url)]
    write_legacy_run(db_url, t0)
    env = {
        "PYTHONPATH": str(ROOT),
        "BATCHRUN_DB": db_url,
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": SENDER,
        "BATCHRUN_LEASE_S": "2",
        "BATCHRUN_RETRY_BASE_S": "0",
        "BATCHRUN_MAIL_TIMEOUT_S": "5",
    }
    apps_before = app_rows(db_url)
    old = table_digest(db_url, ["batchrun_task", "batchrun_queue"])
    queue_before = query(db_url, f"SELECT {QUEUE_COLUMNS} FROM batchrun_queue ORDER BY id")

    # Before the upgrade the new version refuses to work: it would start a ledger of its own.
    for args in (("birthday", "--month", "2025-06", "--json"), ("retry", "--json")):
        code, _, output = cli(env, *args)
        assert code == 1 and "batchrun db migrate" in output, output
    assert smtp_server.messages == []
    assert app_rows(db_url) == apps_before
    assert table_digest(db_url, ["batchrun_task", "batchrun_queue"]) == old

    # The upgrade: every old ledger row copied, nothing of the application's touched.
    code, _, output = cli(env, "db", "migrate")
    assert code == 0, output
    assert app_rows(db_url) == apps_before
    assert table_digest(db_url, ["batchrun_task", "batchrun_queue"]) == old  # 0.1's stay
    migrated = ledger(db_url)
    assert migrated == ledger_from_task(db_url)
    assert len(migrated) == len(JUNE) + len(SENT_2024)
    for uid in JUNE:
        period, state, *_ = migrated[("birthday", "2025", uid)]
        assert period == "2025-06"
        assert state == (1 if uid in SENT else 3 if uid in RETRYING else 4 if uid == FAILED else 2)
    assert migrated[("birthday", "2025", 17)][1:] == (3, 2, None, None, 1, TEMPORARY, t0 + 2)
    assert migrated[("birthday", "2025", UNQUEUED)][1:] == (3, 1, None, None, 0, TEMPORARY, t0 + 1)
    assert migrated[("birthday", "2025", FAILED)][1:] == (4, 1, None, None, 1, PERMANENT, t0)
    assert migrated[("birthday", "2025", SKIPPED)][1:] == (2, 1, None, None, 0, INVALID, t0)
    assert migrated[("birthday", "2024", 1)][0] == "2024-06"

    # A second migrate changes nothing at all (the copy is not made twice).
    after = (table_digest(db_url), schema(db_url))
    code, _, output = cli(env, "db", "migrate")
    assert code == 0, output
    assert "up to date" in output
    assert (table_digest(db_url), schema(db_url)) == after

    # The migrated ledger reads as 0.1 left the month.
    before = status(env)
    assert before["cards"] == len(SENT) + len(RETRYING) + 1
    assert before["emails_sent"] == len(SENT)
    assert before["retrying"] == before["pending"] == len(RETRYING)
    assert before["failed_permanent"] == before["skipped"] == 1
    assert before["retry_queue_depth"] == len(RETRYING) - 1 + 1  # and the continuation
    assert before["dead_letter_depth"] == 1

    if order == "retry_first":
        # The v1 messages do the work: the continuation retries 11, 17 and 19 in its range,
        # the retry of 5 does 5, the retries of 11 and 17 then find them done. 19's retry,
        # re-sent from the ledger as 0.1 would have, finds it done too.
        drained = retry(env)
        assert drained["succeeded"] == len(RETRYING), drained
        assert drained["requeued"] == 1, drained
        assert smtp_server.sends_per_user(2025) == dict.fromkeys(RETRYING, 1)
        again = rerun(env)
        assert again["eligible"] == again["emails_sent"] == 0, again
    else:
        # The rerun of the month finds nothing new for the sent, and retries the waiting.
        first = rerun(env)
        assert first["eligible"] == first["emails_sent"] == len(RETRYING), first
        assert smtp_server.sends_per_user(2025) == dict.fromkeys(RETRYING, 1)
        drained = retry(env)
        assert drained["succeeded"] == drained["requeued"] == 0, drained  # all found done
    last = rerun(env)  # a rerun of a finished month sends nothing
    assert last["eligible"] == last["emails_sent"] == 0, last

    # Each user waiting for a retry was emailed once, with 0.1's card and Message-ID.
    assert smtp_server.sends_per_user() == dict.fromkeys(RETRYING, 1)
    by_id = {m.message_id: m for m in smtp_server.messages}
    assert set(by_id) == {f"<birthday.2025.{uid}@example.com>" for uid in RETRYING}
    for uid in RETRYING:
        message = by_id[f"<birthday.2025.{uid}@example.com>"]
        assert message.recipients == [f"user{uid}@example.org"]
        text = message.email.get_body(preferencelist=("plain",))
        assert text is not None
        assert display(code_of(2025, uid)) in text.get_content()

    # Nothing new was created: no card, no user changed; the old tables as 0.1 left them.
    assert app_rows(db_url) == apps_before
    assert card_counts(db_url, 2025) == dict.fromkeys([*SENT, *RETRYING, FAILED], 1)
    assert table_digest(db_url, ["batchrun_task"]) == {"batchrun_task": old["batchrun_task"]}

    # The ledger: the waiting users sent, every other row exactly as migrated.
    final = ledger(db_url)
    assert set(final) == set(migrated)
    for key, row in final.items():
        uid = key[2]
        if key[1] == "2025" and uid in RETRYING:
            # (queued is not asserted: the consumer leaves it 1 on what it finished, as 0.1
            # did, and only a RETRYING row's queued is ever read.)
            period, state, attempts, owner, lease, _, error, _ = row
            assert (period, state, owner, lease, error) == ("2025-06", 1, None, None, None), (
                key,
                row,
            )
            assert attempts > RETRYING[uid], (key, row)
        else:
            assert row == migrated[key], key

    # The queue: drained, and the dead letter still dead and untouched.
    assert query(db_url, f"SELECT {QUEUE_COLUMNS} FROM batchrun_queue ORDER BY id") == [
        queue_before[0]
    ]
    end = status(env)
    assert end["cards"] == len(SENT) + len(RETRYING) + 1
    assert end["emails_sent"] == len(SENT) + len(RETRYING)
    assert end["pending"] == end["retrying"] == end["claimed"] == 0
    assert end["failed_permanent"] == end["skipped"] == 1
    assert end["retry_queue_depth"] == 0
    assert end["dead_letter_depth"] == 1
    assert {(p["id"], p["state"]) for p in end["problems"]} == {
        (FAILED, "failed"),
        (SKIPPED, "skipped"),
    }

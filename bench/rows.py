"""Rows examined by each of batchrun's statements, free of other sessions' noise.

Runs a job (the birthday job by default; ``--jobs FILE --job NAME`` for another) in-process
with the discard mailer on ONE database connection and reads that session's
``Handler_read_*`` counters around every statement, so the numbers are batchrun's alone
even on a busy shared server (the global counters of ``bench/run.py`` include every
session). batchrun's own statements are named as in ``batchrun/sql`` (``finish``); a
job's ``ctx.db`` statements by the job's query name (``birthday.page``) when its
``SqlFolder`` has it, else by their first words. Empty the job's tables first for a full
month (``--reset`` does it). Prints a table, or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from batchrun.db import Store, connect
from batchrun.db.base import Database
from batchrun.job import Job
from batchrun.jobs.birthday import Birthday
from batchrun.mail.base import from_url as mailer_from_url
from batchrun.period import parse as parse_period
from batchrun.registry import discover, parse_specs
from batchrun.runtime import Options, Runtime
from batchrun.settings import Settings
from bench.mysqlstat import HANDLER_READS

_SNAPSHOT = "SHOW SESSION STATUS WHERE Variable_name IN ({})".format(
    ", ".join(f"'{name}'" for name in HANDLER_READS)
)
_PARAMETER = re.compile(r"(?<![:\w]):[A-Za-z_]")


class Meter:
    """Wraps a Database's query methods to count rows examined per statement name.

    ``execute``/``fetchall`` run batchrun's named statements (named by their first
    argument); ``execute_sql``/``fetch_columns`` run compiled SQL, the jobs' ``ctx.db``
    statements, named by the job's query whose text the SQL starts with (``prefixes``).
    ``fetchone``/``fetchval`` go through ``fetchall``, so every statement is counted once.
    """

    def __init__(self, db: Database, prefixes: dict[str, str] | None = None) -> None:
        self.db = db
        self.rows: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.calls: Counter[str] = Counter()
        self.noise: dict[str, int] = {}
        self.prefixes = prefixes or {}  # a job query's text up to its first parameter -> name
        self._names: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def snapshot(self) -> dict[str, int]:
        rows = await self.db.fetch_sql(_SNAPSHOT, ())
        return {str(name): int(value) for name, value in rows}

    async def install(self) -> None:
        a = await self.snapshot()
        b = await self.snapshot()
        self.noise = {k: b[k] - a[k] for k in a}
        for method in ("execute", "fetchall", "execute_sql", "fetch_columns"):
            setattr(self.db, method, self._wrap(method, getattr(self.db, method)))

    def _wrap(self, method: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def metered(name: str, *args: Any, **params: Any) -> Any:
            # One connection: the lock keeps snapshot, statement, snapshot together.
            async with self._lock:
                before = await self.snapshot()
                result = await call(name, *args, **params)
                after = await self.snapshot()
            if args:  # compiled SQL (ctx.db): the job's query name, or its first words
                name = self.name_of(name)
            self.calls[name] += 1
            for key, value in after.items():
                self.rows[name][key] += value - before[key] - self.noise.get(key, 0)
            return result

        return metered

    def name_of(self, sql: str) -> str:
        """The name of compiled statement ``sql``: the job query it was compiled from."""
        name = self._names.get(sql)
        if name is None:
            text = " ".join(sql.split())
            matches = [(len(p), n) for p, n in self.prefixes.items() if text.startswith(p)]
            name = max(matches)[1] if matches else " ".join(text.split()[:4])
            self._names[sql] = name
        return name


def job_prefixes(job: Job, dialect: str) -> dict[str, str]:
    """Each of the job's named queries, by its text up to the first ``:parameter``."""
    if job.sql is None:
        return {}
    out = {}
    for name, statement in job.sql.statements(dialect).items():
        head = _PARAMETER.split(statement.text, maxsplit=1)[0]
        out[" ".join(head.split())] = f"{job.name}.{name}"
    return out


def load_job(specs: str | None, name: str) -> Job:
    """The job ``name``: built-in, or from ``specs`` (``--jobs``)."""
    if name == Birthday.name and not specs:
        return Birthday()
    return discover(parse_specs(specs)).get_job(name)


async def measure(
    db_url: str, month: str, concurrency: int, reset: bool, job: Job | None = None
) -> dict[str, Any]:
    """Run ``job`` (default: birthday) for the month with the discard mailer; return rows
    examined by statement."""
    job = job or Birthday()
    db = await connect(db_url, pool_size=1)
    try:
        if reset:
            for table in ("gift_card", "batchrun_ledger", "batchrun_queue"):
                await db.fetch_sql(f"TRUNCATE TABLE `{table}`", ())
        store = Store(db)
        settings = Settings(db_url=db_url, mail_url="discard://")
        mailer = mailer_from_url("discard://")
        queue = await _local_queue(settings, store, concurrency)
        meter = Meter(db, job_prefixes(job, db.dialect))
        await meter.install()
        runtime = Runtime(job, store, mailer, queue, settings)
        started = time.monotonic()
        summary = await runtime.run(
            parse_period(job.period, month), Options(concurrency=concurrency)
        )
        elapsed = time.monotonic() - started
        await queue.close()
    finally:
        await db.close()
    eligible = summary.eligible or 1
    statements: dict[str, dict[str, Any]] = {
        name: {
            "calls": meter.calls[name],
            "rows": sum(counts.values()),
            "per_user": round(sum(counts.values()) / eligible, 3),
            "by_counter": {k.removeprefix("Handler_read_"): v for k, v in counts.items() if v},
        }
        for name, counts in sorted(meter.rows.items(), key=lambda kv: -sum(kv[1].values()))
    }
    total = sum(sum(counts.values()) for counts in meter.rows.values())
    return {
        "job": job.name,
        "eligible": summary.eligible,
        "emails_sent": summary.emails_sent,
        "rows_examined": total,
        "rows_per_user": round(total / eligible, 3),
        "statements": sum(meter.calls.values()),
        "statements_per_user": round(sum(meter.calls.values()) / eligible, 4),
        "duration_s": round(elapsed, 3),
        "by_statement": statements,
    }


async def _local_queue(settings: Settings, store: Store, concurrency: int) -> Any:
    """The default retry queue (a table in the job's database), across batchrun versions."""
    try:
        from batchrun.runtime.resources import open_queue
    except ImportError:
        from batchrun.queue.base import from_url

        return from_url(None, db=store.db, max_receives=settings.max_receives)
    return await open_queue(settings, None, store, concurrency=concurrency)


def main() -> None:
    """Parse options, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="mysql://user:pass@host:port/db")
    parser.add_argument("--month", default="2025-06")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--reset", action="store_true", help="empty the job's tables first")
    parser.add_argument("--jobs", default=None, help="modules or .py files of jobs (--jobs)")
    parser.add_argument("--job", default="birthday", help="the job to run (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    job = load_job(args.jobs, args.job)
    result = asyncio.run(measure(args.db, args.month, args.concurrency, args.reset, job))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['job']}: {result['eligible']} eligible users, "
        f"{result['rows_examined']} rows examined "
        f"= {result['rows_per_user']} per user, {result['statements']} statements"
    )
    for name, s in result["by_statement"].items():
        counters = " ".join(f"{k}={v}" for k, v in s["by_counter"].items())
        print(f"  {name:<24} {s['calls']:>6} calls {s['per_user']:>7.3f}/user  {counters}")


if __name__ == "__main__":
    main()

"""Where batchrun's CPU per entity goes against Postfix's ``smtp-sink``, in one sitting.

Four contenders, run in alternating rounds on the same sink (so a change in the machine's
load falls on all of them), each a child process whose user and system CPU come from its
rusage, start-up included:

- ``lean``: ``bench/lean.py``, raw SMTP over asyncio streams, pre-built bytes (the floor);
- ``mailer``: batchrun's ``SmtpMailer.send`` alone, on the birthday's ``Message`` objects
  built before the clock (its bytes, the SMTP transaction, the pool): what sending costs;
- ``batchrun discard``: ``batchrun birthday --mail discard://``: the database, the
  pipeline, the template and the message's fields, without SMTP;
- ``batchrun smtp``: the birthday run against the sink: everything, on asyncio's loop;
- ``batchrun uvloop``: the same on uvloop (``BATCHRUN_EVENT_LOOP=uvloop``, the default
  where the ``uvloop`` extra is installed).

Every batchrun contender but the last runs with ``BATCHRUN_EVENT_LOOP=asyncio``.

``python -m bench.decompose --users 300000 --rounds 2`` (a database ``batchrun_decompose``
on the MariaDB of ``--mysql``, migrated and seeded first unless ``--reuse``; dropped at
the end unless ``--keep-db``). Prints one line per contender and round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.mysqlstat import Server

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DATABASE = "batchrun_decompose"


def child(
    cmd: list[str], env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``cmd``; return it with its user and system CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd[:4])} ...: exit {done.returncode}: {done.stderr[-500:]}")
    return done, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def mysql(server: str, sql: str, database: str = "") -> None:
    """Run ``sql``'s statements on the bench's MariaDB."""
    with Server(server).connect(database or None) as conn, conn.cursor() as cur:
        for statement in filter(str.strip, sql.split(";")):
            cur.execute(statement)


async def mailer_only(port: int, count: int, concurrency: int) -> dict[str, Any]:
    """``SmtpMailer.send`` over ``concurrency`` tasks, ``count`` birthday messages."""
    from batchrun.mail.smtp import SmtpMailer
    from bench.ceiling import sample_message_objects

    messages = sample_message_objects(min(count, 256))
    # asyncio reads a socket into a 256 KiB buffer, above glibc's first mmap threshold: in
    # a process that never freed a block that large, every read is mmap, mremap, munmap
    # (seen with strace -c here, not in batchrun's run). Freeing one such block raises
    # the threshold, as a long-running process's own work does.
    block = bytes(1 << 19)
    del block
    mailer = SmtpMailer("127.0.0.1", port, pool_size=concurrency)
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < count:
            message = messages[sent % len(messages)]
            sent += 1
            await mailer.send(message)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    await mailer.close()
    return {"messages": count, "per_s": round(count / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=300_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--mysql", default=os.environ.get("BENCH_MYSQL", "mysql://root@127.0.0.1:3306/")
    )
    parser.add_argument("--reuse", action="store_true", help="the database is seeded already")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument(
        "--mailer-only", nargs=3, type=int, metavar=("PORT", "COUNT", "C"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.mailer_only:
        print(json.dumps(asyncio.run(mailer_only(*args.mailer_only))))
        return

    from bench.postfix_sink import PostfixSink
    from bench.run import MAIL_ENV, child_env

    env = {**child_env(), **MAIL_ENV}
    db_url = Server(args.mysql).db_url(DATABASE)
    batchrun = [PYTHON, "-m", "batchrun", "--db", db_url]
    if not args.reuse:
        mysql(args.mysql, f"DROP DATABASE IF EXISTS {DATABASE}; CREATE DATABASE {DATABASE}")
        child([*batchrun, "db", "migrate"], env)
        child([*batchrun, "db", "seed", "--users", str(args.users), "--seed", "1"], env)
    sink = PostfixSink()
    try:
        for number in range(1, args.rounds + 1):
            eligible = 0
            for name in ("batchrun discard", "batchrun smtp", "batchrun uvloop", "lean", "mailer"):
                if name.startswith("batchrun"):
                    mysql(
                        args.mysql,
                        "TRUNCATE gift_card; TRUNCATE batchrun_ledger; TRUNCATE batchrun_queue",
                        DATABASE,
                    )
                    mail = "discard://" if "discard" in name else f"smtp://127.0.0.1:{sink.port}"
                    cmd = [*batchrun, "--mail", mail, "birthday", "--month", "2025-06"]
                    cmd += ["--concurrency", str(args.concurrency), "--json"]
                elif name == "lean":
                    cmd = [PYTHON, "-m", "bench.lean", "--port", str(sink.port)]
                    cmd += ["--messages", str(eligible), "--concurrency", str(args.concurrency)]
                else:
                    cmd = [PYTHON, "-m", "bench.decompose", "--mailer-only", str(sink.port)]
                    cmd += [str(eligible), str(args.concurrency)]
                loop = "uvloop" if name == "batchrun uvloop" else "asyncio"
                done, user, system = child(cmd, {**env, "BATCHRUN_EVENT_LOOP": loop})
                result = json.loads(done.stdout.strip().splitlines()[-1])
                if name.startswith("batchrun"):
                    eligible = int(result["eligible"])
                    rate = eligible / result["duration_s"]
                else:
                    rate = float(result["per_s"])
                print(
                    f"round {number}  {name:17} user {user / eligible * 1e3:.3f} + sys "
                    f"{system / eligible * 1e3:.3f} = {(user + system) / eligible * 1e3:.3f} ms "
                    f"CPU/entity, {rate:,.0f}/s ({eligible:,} entities)",
                    flush=True,
                )
    finally:
        sink.close()
        if not args.keep_db:
            mysql(args.mysql, f"DROP DATABASE IF EXISTS {DATABASE}")


if __name__ == "__main__":
    main()

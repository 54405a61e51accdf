"""A worker's tasks per second, no-op tasks on the local queue (MariaDB): ``make bench-tasks``.

Per variant, a fresh database ``batchrun_bench_tasks`` (``batchrun db migrate``), then
``--tasks`` no-op tasks (``bench/noop_task.py``) submitted with the client
(``batchrun.connect().submit``, one at a time, as a web view would: the submit rate),
round-robin over the entities, so a receive holds different entities; then ONE
``batchrun worker --jobs bench/noop_task.py --prefetch 100 --concurrency 50 --idle-exit 1``
subprocess on the local queue in the same database, until the queue is empty.

Reported: tasks/s (the ledger's first start to its last finish, server clock), the
worker's CPU ms per task (its user + system CPU, from the children's rusage, less a
worker that started on an empty queue and idled out the same way: start-up and the idle
second), mariadbd's CPU
over the worker's life (from /proc, as ``bench/run.py`` reads it), and the machine's CPU
used by every other process meanwhile (other engineers' tests on a shared machine).
Checked, or exit 1: every task succeeded with one attempt, and the queue is empty.

Variants: ``several`` (``--tasks`` over ``--entities``, several a entity: serial per entity
counts) and ``distinct`` (each task its own entity).

    python -m bench.tasks_rate                                   # both variants, 20,000 tasks
    python -m bench.tasks_rate --tasks 5000 --variants distinct --json /tmp/t.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import mysqlstat
from bench.mysqlstat import Server

ROOT = Path(__file__).resolve().parent.parent
JOBS = str(ROOT / "bench" / "noop_task.py")
DATABASE = "batchrun_bench_tasks"
SAQ_MS = 0.9  # SAQ's published figure: ~0.9 ms per job (its README's benchmark)
GOAL_PER_S = 1000.0


def child_env(db_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    paths = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(
        {
            "BATCHRUN_DB": db_url,
            "BATCHRUN_JOBS": JOBS,
            "BATCHRUN_MAIL": "discard://",
            "BATCHRUN_LOG_LEVEL": "WARNING",
            "BATCHRUN_EVENT_LOOP": "asyncio",  # as the results measured before uvloop
        }
    )
    return env


def fresh(server: Server) -> str:
    with server.connect() as conn:
        mysqlstat.query(conn, f"DROP DATABASE IF EXISTS {DATABASE}")
        mysqlstat.query(conn, f"CREATE DATABASE {DATABASE}")
    db_url = server.db_url(DATABASE)
    done = subprocess.run(
        [sys.executable, "-m", "batchrun", "db", "migrate"],
        env=child_env(db_url),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"db migrate failed: {done.stderr[-2000:]}")
    return db_url


def submit(db_url: str, tasks: int, entities: int) -> float:
    """Submit ``tasks`` over ``entities`` round-robin; seconds taken."""
    import batchrun

    started = time.monotonic()
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        for n in range(tasks):
            client.submit("noop", n % entities + 1, key=f"t{n}")
    return time.monotonic() - started


def worker(db_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One worker subprocess until the queue stays empty for a second; its exit and wall
    time."""
    cmd = [
        sys.executable,
        "-m",
        "batchrun",
        "worker",
        "--concurrency",
        str(args.concurrency),
        "--prefetch",
        str(args.prefetch),
        "--idle-exit",
        "1",
        "--json",
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=child_env(db_url),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate()
    wall = time.monotonic() - started
    return {"code": proc.returncode, "stdout": out, "stderr": err, "wall_s": wall}


def timed_worker(db_url: str, args: argparse.Namespace, mariadb: int | None) -> dict[str, Any]:
    """``worker`` with its own CPU (children's rusage delta) and mariadbd's, and the
    machine's busy CPU, over its life."""
    before = os.times()
    db0 = mysqlstat.process_cpu_s(mariadb)
    busy0 = mysqlstat.machine_busy_s()
    ran = worker(db_url, args)
    after = os.times()
    db1 = mysqlstat.process_cpu_s(mariadb)
    busy1 = mysqlstat.machine_busy_s()
    ran["cpu_s"] = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    ran["db_cpu_s"] = None if db0 is None or db1 is None else db1 - db0
    ran["machine_busy_s"] = busy1 - busy0
    return ran


def ledger(server: Server) -> dict[str, Any]:
    with server.connect(DATABASE) as conn:
        rows = mysqlstat.query(
            conn,
            "SELECT COUNT(*), SUM(state = 2 AND attempts = 1), MIN(started_at),"
            " MAX(finished_at) FROM batchrun_entity_task",
        )
        depth = mysqlstat.query(conn, "SELECT COUNT(*) FROM batchrun_queue")[0][0]
    total, once, first, last = rows[0]
    return {
        "tasks": int(total),
        "once": int(once or 0),
        "first_ms": first,
        "last_ms": last,
        "queue_left": int(depth),
    }


def variant(
    server: Server, name: str, entities: int, args: argparse.Namespace, baseline: dict[str, Any]
) -> dict[str, Any]:
    db_url = fresh(server)
    submit_s = submit(db_url, args.tasks, entities)
    with server.connect() as conn:
        mariadb = mysqlstat.server_pid(conn)
    ran = timed_worker(db_url, args, mariadb)
    if ran["code"] != 0:
        raise SystemExit(f"worker exited {ran['code']}: {ran['stderr'][-2000:]}")
    book = ledger(server)
    ok = book["tasks"] == args.tasks and book["once"] == args.tasks and book["queue_left"] == 0
    span_s = max(0.001, (int(book["last_ms"]) - int(book["first_ms"])) / 1000)
    cpu_s = max(0.0, ran["cpu_s"] - baseline["cpu_s"])
    db_cpu = ran["db_cpu_s"]
    db_base = baseline["db_cpu_s"] or 0.0
    others = ran["machine_busy_s"] - ran["cpu_s"] - (db_cpu or 0.0)
    return {
        "variant": name,
        "tasks": args.tasks,
        "entities": entities,
        "concurrency": args.concurrency,
        "prefetch": args.prefetch,
        "submit_s": round(submit_s, 2),
        "submit_per_s": round(args.tasks / submit_s, 1),
        "worker_wall_s": round(ran["wall_s"], 2),
        "span_s": round(span_s, 2),
        "tasks_per_s": round(args.tasks / span_s, 1),
        "ms_per_task": round(span_s * 1000 / args.tasks, 3),
        "worker_cpu_ms_per_task": round(cpu_s * 1000 / args.tasks, 3),
        "db_cpu_ms_per_task": None
        if db_cpu is None
        else round(max(0.0, db_cpu - db_base) * 1000 / args.tasks, 3),
        "others_cpu_share": round(max(0.0, others) / ran["wall_s"], 2),
        "exactly_once": ok,
        "ledger": book,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mysql", default=os.environ.get("BENCH_MYSQL", "mysql://root:@127.0.0.1:3306/")
    )
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--entities", type=int, default=2_000, help="for the 'several' variant")
    parser.add_argument("--variants", default="several,distinct")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args(argv)
    server = Server(args.mysql)
    load = os.getloadavg()
    # A worker on an empty queue: start-up, the idle second, exit (subtracted).
    db_url = fresh(server)
    with server.connect() as conn:
        mariadb = mysqlstat.server_pid(conn)
    baseline = timed_worker(db_url, args, mariadb)
    results = []
    for name in args.variants.split(","):
        entities = {"several": args.entities, "distinct": args.tasks}[name]
        result = variant(server, name, entities, args, baseline)
        results.append(result)
        print(
            f"{name:9s} {result['tasks']:,} tasks / {entities:,} entities: "
            f"submit {result['submit_per_s']:,.0f}/s; worker {result['tasks_per_s']:,.0f}/s "
            f"({result['ms_per_task']} ms/task; SAQ ~{SAQ_MS} ms/job), "
            f"worker CPU {result['worker_cpu_ms_per_task']} ms/task, "
            f"mariadbd {result['db_cpu_ms_per_task']} ms/task, other processes "
            f"{result['others_cpu_share']:.0%} of a core; exactly once: {result['exactly_once']}",
            flush=True,
        )
    if not args.keep_db:
        with server.connect() as conn:
            mysqlstat.query(conn, f"DROP DATABASE IF EXISTS {DATABASE}")
    report = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "baseline_worker_cpu_s": round(baseline["cpu_s"], 3),
        "goal_per_s": GOAL_PER_S,
        "saq_ms_per_job": SAQ_MS,
        "results": results,
    }
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}")
    if not all(r["exactly_once"] for r in results):
        print("NOT exactly once: see the ledger figures", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()

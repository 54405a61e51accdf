"""This checkout's birthday run against an older commit's, in one sitting, on one sink.

``make bench`` asks for no regression of the birthday job's rate beyond 3% "same run, same
machine". This measures exactly that: the base commit is checked out in a temporary git
worktree, each tree migrates and seeds its own database (``batchrun_versus_base`` and
``batchrun_versus_head``, same ``--users`` and seed) with its own code, and then the two
trees' ``batchrun birthday --month 2025-06 --json`` runs alternate against one Postfix
``smtp-sink`` (and, with ``--sink bench``, the bench's own 20 ms sink), each a child
whose user and system CPU come from its rusage, start-up included. Each round truncates
the job's tables of both databases first, so every run starts from the same state.

``python -m bench.versus --base f49fa90 --users 1000000 --rounds 3`` prints one line per
run and, at the end, each tree's best rate and lowest CPU per entity and their ratio.
The base runs on this venv's packages: f49fa90 needs ``pip install aiolimiter``, which
this checkout no longer depends on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.mysqlstat import Server
from bench.postfix_sink import PostfixSink

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TABLES = "TRUNCATE gift_card; TRUNCATE batchrun_ledger; TRUNCATE batchrun_queue"


def mysql(server: str, sql: str, database: str = "") -> None:
    """Run ``sql``'s statements on the bench's MariaDB."""
    with Server(server).connect(database or None) as conn, conn.cursor() as cur:
        for statement in filter(str.strip, sql.split(";")):
            cur.execute(statement)


def run(tree: Path, cmd: list[str]) -> tuple[dict, float]:
    """``python -m batchrun *cmd`` with ``tree`` first on the path; its JSON and CPU seconds."""
    from bench.run import MAIL_ENV

    # Both trees on asyncio's loop: a tree that runs on uvloop where it is installed would
    # take its 4-11% against an older one that cannot (``--loop`` in bench.run compares
    # loops).
    env = {**MAIL_ENV, **os.environ, "PYTHONPATH": str(tree), "BATCHRUN_EVENT_LOOP": "asyncio"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [PYTHON, "-m", "batchrun", *cmd], env=env, cwd=tree, capture_output=True, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # 0 only: a run the breaker stopped (3) hands on the rest and would look fast.
    if done.returncode != 0:
        hint = ""
        if "No module named" in done.stderr:  # f49fa90 still imports aiolimiter, for one
            hint = "\n(the base needs a package this venv lacks: pip install it, run again)"
        raise SystemExit(
            f"{tree}: {' '.join(cmd[2:5])}: exit {done.returncode}: {done.stderr[-400:]}{hint}"
        )
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if "birthday" in cmd and not result.get("eligible"):
        raise SystemExit(f"{tree}: the birthday run printed no summary: {done.stdout[-300:]}")
    return result, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="f49fa90", help="the commit to compare with")
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--concurrency", default="50,200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--mysql", default=os.environ.get("BENCH_MYSQL", "mysql://root@127.0.0.1:3306/")
    )
    parser.add_argument("--reuse", action="store_true", help="both databases are seeded already")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()

    work = tempfile.TemporaryDirectory(prefix="bench-versus-")
    base = Path(work.name) / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=ROOT, check=True
    )
    trees = {"base": base, "head": ROOT}
    sink: PostfixSink | None = None
    try:
        urls = {name: Server(args.mysql).db_url(f"batchrun_versus_{name}") for name in trees}
        sink = PostfixSink()
        if not args.reuse:
            for name, tree in trees.items():
                database = f"batchrun_versus_{name}"
                mysql(args.mysql, f"DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}")
                run(tree, ["--db", urls[name], "db", "migrate"])
                seed = ["db", "seed", "--users", str(args.users), "--seed", "1"]
                run(tree, ["--db", urls[name], *seed])
        best = compare(args, trees, urls, sink.port)
        for concurrency in map(int, args.concurrency.split(",")):
            (b_rate, b_ms), (h_rate, h_ms) = best["base", concurrency], best["head", concurrency]
            print(
                f"c{concurrency}: base {b_rate:,.0f}/s {b_ms:.3f} ms, head {h_rate:,.0f}/s "
                f"{h_ms:.3f} ms: head at {h_rate / b_rate:.0%} of base's rate, "
                f"{h_ms / b_ms:.0%} of its CPU"
            )
    finally:
        if sink is not None:
            sink.close()
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
        if not args.keep_db:
            for name in trees:
                try:
                    mysql(args.mysql, f"DROP DATABASE IF EXISTS batchrun_versus_{name}")
                except Exception as exc:  # the run's own error, if any, matters more
                    print(f"could not drop batchrun_versus_{name}: {exc}", file=sys.stderr)


def compare(
    args: argparse.Namespace, trees: dict[str, Path], urls: dict[str, str], port: int
) -> dict[tuple[str, int], list[float]]:
    """The rounds: both trees at each concurrency, base first in odd rounds and head first
    in even ones; each tree's best rate and lowest CPU per entity by concurrency."""
    best: dict[tuple[str, int], list[float]] = {}
    for number in range(1, args.rounds + 1):
        order = list(trees) if number % 2 else list(reversed(trees))
        for concurrency in map(int, args.concurrency.split(",")):
            for name in order:
                mysql(args.mysql, TABLES, f"batchrun_versus_{name}")
                cmd = ["--db", urls[name], "--mail", f"smtp://127.0.0.1:{port}", "birthday"]
                cmd += ["--month", "2025-06", "--concurrency", str(concurrency), "--json"]
                result, cpu = run(trees[name], cmd)
                eligible = int(result["eligible"])
                rate = eligible / result["duration_s"]
                ms = cpu / eligible * 1e3
                got = best.setdefault((name, concurrency), [0.0, float("inf")])
                got[0], got[1] = max(got[0], rate), min(got[1], ms)
                print(
                    f"round {number}  c{concurrency:<4} {name}  {rate:8,.0f} users/s  "
                    f"{ms:.3f} ms CPU/entity  ({eligible:,} eligible)",
                    flush=True,
                )
    return best


if __name__ == "__main__":
    main()

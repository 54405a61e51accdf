"""Where a backend's ``--rate auto`` settles against an API that throttles above its limit.

The credits example job (``examples/credits``: ``ctx.http("credits")``,
``Backend(rate="auto")``) runs with ``--rate auto`` against a local grants API that answers
``429`` with ``Retry-After: 1`` to every call beyond ``--limit`` (200) in one wall-clock
second, and ``201`` otherwise. It prints the rate the job's backend settled at (the run
summary's ``backends.credits.rate``, a time-weighted mean of its last ten seconds or so)
and what the API itself served per second once the rate had settled; the goal is both
within 15% of the limit::

    python -m bench.backend_rate [--limit 200] [--customers 16000] [--concurrency 40]
                                 [--settle-s 20] [--db sqlite:///... | mysql://...]
                                 [--json out.json]

The law (``batchrun/effects/backends.py``). Mail's AIMD, halving on a throttle and adding
1 call/s each second, saws between L/2 and L: its mean rate is about 0.75 L, and with a
``Retry-After`` pause of 1 s after each throttle the API serves about 0.74 L (150 of 200,
in a fake-clock run of the same loop, ``tests/guarantees/test_backends.py``). For backends the
decrease is gentler: a throttle multiplies the rate by 0.9, so the saw runs between 0.9 L
and L (a mean of 0.95 L) and a throttle comes every (0.1 L / 1) seconds, 20 s at 200/s,
each costing its 1 s pause: about 0.9 L served (182 of 200 on the fake clock). A larger
additive step would throttle more often and lose more to the pauses. The search for L
starts with slow start (the rate doubles each second of backlogged success, from 10/s, until
the first throttle), so 200/s is reached in about five seconds instead of three minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "credits" / "credits.py"
SETTLE_S = 20  # seconds from the run's start left out of the served figures (--settle-s)


class ThrottlingApi:
    """``POST /grants``: 201 up to ``limit`` calls a second, then 429 ``Retry-After: 1``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.served: Counter[int] = Counter()  # second -> calls granted
        self.throttled: Counter[int] = Counter()  # second -> calls answered 429
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.request_queue_size = 256
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(self) -> int:
        second = int(time.time())
        with self._lock:
            if self.served[second] >= self.limit:
                self.throttled[second] += 1
                return 429
            self.served[second] += 1
            return 201

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status = api.answer()
                body = json.dumps({"id": f"g{time.time_ns()}"} if status == 201 else {})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> ThrottlingApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def batchrun(env: dict[str, str], *args: str, timeout: float = 1800) -> str:
    """``python -m batchrun --jobs examples/credits/credits.py ARGS``; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "batchrun", "--jobs", str(JOB), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    if done.returncode not in (0, 3):
        raise SystemExit(f"batchrun {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done.stdout


def seed(db_url: str, customers: int) -> None:
    """``customers`` active starter customers in the credits job's table."""
    import asyncio

    from batchrun.db import connect
    from batchrun.db.base import JobDatabase

    async def go() -> None:
        database = await connect(db_url)
        try:
            jobdb = JobDatabase(database)
            for start in range(0, customers, 1000):
                rows = [
                    (f"c{i}@example.com", "starter", 1)
                    for i in range(start, min(customers, start + 1000))
                ]
                await jobdb.execute(
                    "INSERT INTO customer (email, plan, active) VALUES :rows", rows=rows
                )
        finally:
            await database.close()

    asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=200, help="calls/s the API grants")
    parser.add_argument("--customers", type=int, default=16_000)
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--db", help="a database URL (default: a new SQLite file)")
    parser.add_argument("--settle-s", type=int, default=SETTLE_S, help="seconds left out")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="batchrun-backend-rate-"))
    db_url = args.db or f"sqlite:///{folder / 'bench.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env.update(BATCHRUN_DB=db_url, BATCHRUN_MAIL="discard://", BATCHRUN_BUILTIN_JOBS="")
    batchrun(env, "db", "migrate")
    seed(db_url, args.customers)
    with ThrottlingApi(args.limit) as api:
        env["BATCHRUN_BACKEND_CREDITS_URL"] = api.url
        started = time.time()
        out = batchrun(
            env,
            "run",
            "credits",
            "--period",
            "2025-06",
            "--rate",
            "auto",
            "--concurrency",
            str(args.concurrency),
            "--page-size",
            "1000",
            "--json",
        )
        ended = time.time()
    summary = json.loads(out)
    figures = summary["backends"]["credits"]
    seconds = range(int(started) + args.settle_s, int(ended))  # whole seconds after settling
    served = [api.served[s] for s in seconds]
    if not served:
        raise SystemExit(f"the run took {ended - started:.0f} s: raise --customers")
    mean = statistics.fmean(served)
    result = {
        "limit": args.limit,
        "customers": args.customers,
        "succeeded": summary["succeeded"],
        "duration_s": summary["duration_s"],
        "settled_rate": figures["rate"],
        "calls": figures["calls"],
        "throttles": figures["throttles"],
        "served_per_s_mean": round(mean, 1),
        "served_per_s_median": statistics.median(served),
        "served_seconds": len(served),
        "throttled_total": sum(api.throttled.values()),
    }
    within = {
        "settled_rate": abs(figures["rate"] - args.limit) <= 0.15 * args.limit,
        "served_per_s_mean": abs(mean - args.limit) <= 0.15 * args.limit,
    }
    print(f"credits --rate auto against an API that throttles above {args.limit} calls/s:")
    print(
        f"  run: {summary['succeeded']} of {args.customers} granted in "
        f"{summary['duration_s']:.0f} s, {figures['calls']} calls, "
        f"{figures['throttles']} answered 429"
    )
    print(
        f"  settled rate (backends.credits.rate): {figures['rate']:.1f}/s "
        f"({figures['rate'] / args.limit:.0%} of the limit)"
    )
    print(
        f"  the API served, per second after the first {args.settle_s} s: mean {mean:.1f}, "
        f"median {statistics.median(served):g} ({mean / args.limit:.0%} of the limit, "
        f"{len(served)} seconds)"
    )
    print(f"  within 15% of {args.limit}: " + ", ".join(f"{k} {v}" for k, v in within.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "within_15pct": within}, indent=2))


if __name__ == "__main__":
    main()

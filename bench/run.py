"""`make bench`: batchrun against the seed's naive algorithm and a bare sender, in one run.

For each size N it creates a fresh MariaDB database with N users (``batchrun db migrate``
then ``batchrun db seed``), starts the SMTP sink (``bench/smtp_sink.py``, its own
process, a set latency per message) and measures, each as a real subprocess:

- ``batchrun``: ``batchrun --mail smtp://sink birthday --month 2025-06 --concurrency C``;
- ``batchrun/discard``: the same with ``--mail discard://`` (the database-bound rate);
- ``greeting``: a user-defined job (``bench/greeting_job.py``, loaded with ``--jobs``): one
  plain text email to the same users, no card, no template;
- ``ceiling``: ``bench/ceiling.py``, C persistent SMTP connections, no database, messages
  built by the birthday job's template; ``ceiling/greeting`` the same with greeting's
  plain text message (the ceiling greeting is judged against: same message size);
- ``naive``: ``bench/naive.py``, the seed's algorithm (only at ``--naive-sizes``);
- ``batchrun/postgresql``: ``batchrun birthday`` against PostgreSQL (``--postgres``, off
  with ``--no-postgres``): the same users (same seed) in a fresh database, the same sink;
  its rows read and round trips come from that database's own ``pg_stat_*`` counters
  (``bench/pgstat.py``), not the MariaDB ones;
- the lean comparison (``--lean-sizes``, default the largest size; ``--lean-only`` for it
  alone): ``batchrun birthday`` and ``lean`` (``bench/lean.py``, raw SMTP over asyncio
  streams, no database) at each ``--lean-concurrency`` (50 and 200), against the bench's
  sink and against Postfix's ``smtp-sink`` (``bench/postfix_sink.py``, a C server that is
  not the limit; skipped with one line if it is not installed), with batchrun's share of
  the lean sender's users/s and each one's CPU per entity.

Before each contender the job's tables are emptied (gift_card, batchrun_ledger,
batchrun_queue), so every contender starts from the same state. Rows examined and round
trips come from MariaDB's GLOBAL status counters, read just before and after each
contender: they include any other session's work on the server at the same time.
Peak RSS is the child's ``ru_maxrss`` from ``wait4``. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import mysqlstat, pgstat, postfix_sink
from bench.mysqlstat import Server, query
from bench.postfix_sink import PostfixSink

ROOT = Path(__file__).resolve().parent.parent
MONTH = "2025-06"
BIN = Path(sys.executable).parent
BATCHRUN = str(BIN / "batchrun") if (BIN / "batchrun").exists() else "batchrun"
JOB_TABLES = ("gift_card", "batchrun_ledger", "batchrun_queue")
GREETING_JOB = ROOT / "bench" / "greeting_job.py"  # the user-defined job, loaded with --jobs
CEILING_TARGET = 0.88  # the issue: birthday at least 88% of the ceiling at 100k and 1M
# "One path for every entity": batchrun >= 75% of the lean sender's users/s against
# smtp-sink, with <= 0.12 ms of its CPU per entity (goals to report, not to assert).
LEAN_TARGET = 0.75
LEAN_CPU_MS_TARGET = 0.12
LEAN_CONCURRENCY = (50, 200)
LEAN_SINKS = ("bench", "smtp-sink")
NAIVE_INDEX = "bench_naive_scheduled_email"
# Why 200: at 20 ms per message a connection carries at most ~50 msg/s, less the SMTP
# round trips (MAIL, RCPT, DATA, body) that queue behind a busy event loop; the ceiling
# measured here is CPU-bound near 3,000-3,500 msg/s, which needs >= 3,500 * ~0.035 s
# ~ 120 messages in flight (Little's law). 100 is latency-bound (~2,300/s), 200 leaves
# headroom, and more only adds connections the loop must poll.
DEFAULT_CONCURRENCY = 200

console = Console(stderr=True, width=max(Console(stderr=True).width, 120))


@dataclass
class Result:
    """One contender at one size."""

    contender: str
    size: int
    eligible: int  # active users with an email born in the month (same for everyone)
    users: int  # users this contender finished (sent, skipped or failed; messages for ceiling)
    sent: int
    duration_s: float  # the contender's own timing of its work
    wall_s: float  # process start to exit
    users_per_s: float
    exit_code: int
    peak_rss_mb: float
    cpu_s: float  # the contender's user + system CPU
    mariadb_cpu_s: float | None
    sink_cpu_s: float | None
    other_cpu_s: float | None  # every other process on the machine meanwhile
    rows_examined: int
    statements: int
    questions: int
    sink_messages: int
    sink_connections: int
    sink_bytes: int = 0
    vs_naive: float | None = None
    vs_ceiling: float | None = None
    sink: str | None = None  # the lean comparison's rows: "bench" or "smtp-sink"
    concurrency: int | None = None  # the lean comparison's rows: their --concurrency
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The contender, with the sink and concurrency of a lean comparison row."""
        if self.sink is None:
            return self.contender
        return f"{self.contender} ({self.sink}, c{self.concurrency})"

    @property
    def cpu_ms_per_entity(self) -> float | None:
        """The process's user + system CPU (start-up included) per user or message done."""
        return 1000 * self.cpu_s / self.users if self.users else None

    @property
    def rows_per_user(self) -> float | None:
        return self.rows_examined / self.eligible if self.eligible and self.is_db else None

    @property
    def trips_per_user(self) -> float | None:
        return self.statements / self.eligible if self.eligible and self.is_db else None

    @property
    def message_bytes(self) -> float | None:
        """The mean size of the messages the sink received (DATA up to the final dot; None
        when the sink does not count bytes, as smtp-sink)."""
        return (
            self.sink_bytes / self.sink_messages if self.sink_bytes and self.sink_messages else None
        )

    @property
    def is_db(self) -> bool:
        return not (self.contender.startswith("ceiling") or self.contender == "lean")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["rows_examined_per_user"] = _round(self.rows_per_user, 3)
        data["round_trips_per_user"] = _round(self.trips_per_user, 3)
        data["message_bytes"] = _round(self.message_bytes, 1)
        data["cpu_ms_per_entity"] = _round(self.cpu_ms_per_entity, 4)
        data["questions_per_user"] = (
            _round(self.questions / self.eligible, 3) if self.eligible and self.is_db else None
        )
        return data


class Sink:
    """The SMTP sink subprocess and its stdin/stdout control channel."""

    def __init__(self, latency_ms: float, impl: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.smtp_sink",
                "--latency-ms",
                str(latency_ms),
                "--impl",
                impl,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_env(),
        )
        assert self.proc.stdout is not None
        self.port = int(json.loads(self.proc.stdout.readline())["port"])

    def command(self, name: str) -> dict[str, Any]:
        """Send one command; return its JSON answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        """Close stdin (the sink exits) and reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Finished:
    """A child process's exit, output and resource use."""

    code: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mb: float
    cpu_s: float


# The email as a real deployment sends it: one-click unsubscribe (a signed token and two
# header fields a message), a redeem link and a postal address in the template. Every child
# gets them (the ceiling's messages too, so both carry the same bytes); the environment
# may override them.
MAIL_ENV = {
    "BATCHRUN_UNSUBSCRIBE_URL": "https://gifts.example.com/unsubscribe",
    "BATCHRUN_UNSUBSCRIBE_SECRET": "bench-unsubscribe-secret-0123456789abcdef",
    "BATCHRUN_REDEEM_URL": "https://gifts.example.com/redeem?code={code}",
    "BATCHRUN_POSTAL_ADDRESS": "Example Gifts Ltd, 1 Example Street, 10115 Berlin",
}


def child_env() -> dict[str, str]:
    """The environment of every child: this tree first on ``PYTHONPATH``.

    The ``batchrun`` script of the venv would otherwise import the package the venv was
    installed from (an editable install of another checkout), not the code whose digest
    the results carry; ``python -m`` children get this tree from their cwd alike.
    """
    env = {**MAIL_ENV, **os.environ}
    paths = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_child(cmd: Sequence[str], *, env: dict[str, str] | None = None) -> Finished:
    """Run ``cmd`` (with ``child_env()`` by default); reap it with wait4 to read its own
    peak RSS and CPU."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, cwd=ROOT, env=env or child_env())
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not reap it again
        return Finished(
            code=proc.returncode,
            stdout=_read(out),
            stderr=_read(err),
            wall_s=wall,
            peak_rss_mb=usage.ru_maxrss / 1024,
            cpu_s=usage.ru_utime + usage.ru_stime,
        )


def _read(f: IO[str]) -> str:
    f.seek(0)
    return f.read()


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return data
    raise ValueError(f"no JSON line in output: {text[-500:]!r}")


class Bench:
    """Runs every contender at every size against one server and one sink."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = Server(args.mysql)
        self.sink = Sink(args.latency_ms, args.sink)
        with self.server.connect() as conn:
            self.mariadb_pid = mysqlstat.server_pid(conn)
            self.noise = self._calibrate(conn)
        self.results: list[Result] = []
        self.lean_results: list[Result] = []  # the lean comparison (--lean-sizes)
        self.sizes: dict[int, dict[str, Any]] = {}
        # The lean comparison's sinks by name: the bench's own (its latency) and smtp-sink.
        self.lean_sinks: dict[str, Sink | PostfixSink] = {}
        self.lean_skipped: str | None = None  # why the smtp-sink rows were left out
        if args.lean_sizes:
            if "bench" in args.lean_sinks:
                self.lean_sinks["bench"] = self.sink
            if "smtp-sink" in args.lean_sinks:
                why = postfix_sink.missing()
                if why is None:
                    try:
                        self.lean_sinks["smtp-sink"] = PostfixSink()
                    except (OSError, RuntimeError) as exc:
                        why = f"it did not start: {exc}"
                if why is not None:
                    self.lean_skipped = f"smtp-sink rows skipped: {why}"
                    console.print(f"[yellow]{self.lean_skipped}[/]", highlight=False)
        self.pg: pgstat.PgServer | None = None
        if not args.no_postgres:
            self.pg = pgstat.PgServer(args.postgres)
            why = self.pg.reachable()
            if why is not None:
                console.print(f"[yellow]PostgreSQL not reachable at {args.postgres}[/]: {why}")
                self.pg = None

    def _calibrate(self, conn: Any) -> dict[str, int]:
        """What reading the counters itself adds to them (subtracted from every delta)."""
        deltas = []
        for _ in range(3):
            a = mysqlstat.counters(conn)
            b = mysqlstat.counters(conn)
            deltas.append(mysqlstat.delta(a, b))
        return {k: int(statistics.median(d[k] for d in deltas)) for k in deltas[0]}

    # -- databases ----------------------------------------------------------------------

    def prepare(self, size: int) -> dict[str, Any]:
        """A fresh database with ``size`` users; returns its facts (seed time, eligible)."""
        name = f"{self.args.db_prefix}{size}"
        url = self.server.db_url(name)
        with self.server.connect() as conn:
            exists = query(conn, "SHOW DATABASES LIKE %s", (name,))
            reuse = False
            if exists and self.args.reuse_db:
                count = query(conn, f"SELECT COUNT(*) FROM `{name}`.`user`")[0][0]  # noqa: S608
                reuse = int(count) == size
            if not reuse:
                query(conn, f"DROP DATABASE IF EXISTS `{name}`")
                query(conn, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        seed_s = None
        if not reuse:
            console.print(f"[bold]{size:,} users[/]: migrate and seed {name} ...")
            migrate = run_child([BATCHRUN, "--db", url, "db", "migrate"])
            _check(migrate, "batchrun db migrate")
            seed = run_child(
                [BATCHRUN, "--db", url, "db", "seed", "--users", str(size), "--seed", "1"]
            )
            _check(seed, "batchrun db seed")
            seed_s = round(seed.wall_s, 2)
            console.print(f"  seeded in {seed_s:.1f} s ({size / seed.wall_s:,.0f} users/s)")
        with self.server.connect(name) as conn:
            query(conn, "ANALYZE TABLE `user`")
            month = int(MONTH.split("-")[1])
            eligible = int(
                query(
                    conn,
                    "SELECT COUNT(*) FROM `user` WHERE MONTH(date_of_birth) = %s "
                    "AND status = 10 AND email IS NOT NULL",
                    (month,),
                )[0][0]
            )
            table_mb = query(
                conn,
                "SELECT (data_length + index_length) / 1048576 FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = 'user'",
            )[0][0]
        facts = {
            "database": name,
            "seed_s": seed_s,
            "seed_method": "batchrun db seed" if seed_s is not None else "reused",
            "eligible": eligible,
            "user_table_mb": round(float(table_mb), 1),
        }
        self.sizes[size] = facts
        return facts

    def reset(self, database: str) -> None:
        """Empty the job's tables so the next contender starts from the same state."""
        with self.server.connect(database) as conn:
            for table in JOB_TABLES:
                query(conn, f"TRUNCATE TABLE `{table}`")

    def drop(self, database: str) -> None:
        with self.server.connect() as conn:
            query(conn, f"DROP DATABASE IF EXISTS `{database}`")

    # -- one measured contender -----------------------------------------------------------

    def measure(
        self, contender: str, size: int, cmd: Sequence[str], sink: Sink | PostfixSink | None = None
    ) -> tuple[Finished, Result]:
        """Run one contender with the counters, CPU and sink (the bench's by default) read
        around it."""
        facts = self.sizes[size]
        digest = package_digest()
        sink = sink or self.sink
        stats0 = sink.command("reset")  # answers the stats before it
        sink0 = float(stats0["cpu_s"])
        with self.server.connect() as conn:
            busy0 = mysqlstat.machine_busy_s()
            db0 = mysqlstat.process_cpu_s(self.mariadb_pid)
            before = mysqlstat.counters(conn)
            finished = run_child(cmd)
            after = mysqlstat.counters(conn)
            db1 = mysqlstat.process_cpu_s(self.mariadb_pid)
            busy1 = mysqlstat.machine_busy_s()
        stats = sink.command("stats")
        d = mysqlstat.delta(before, after)
        d = {k: max(0, v - self.noise.get(k, 0)) for k, v in d.items()}
        db_cpu = None if db0 is None or db1 is None else db1 - db0
        result = Result(
            contender=contender,
            size=size,
            eligible=int(facts["eligible"]),
            users=0,
            sent=0,
            duration_s=0.0,
            wall_s=round(finished.wall_s, 3),
            users_per_s=0.0,
            exit_code=finished.code,
            peak_rss_mb=round(finished.peak_rss_mb, 1),
            cpu_s=round(finished.cpu_s, 2),
            mariadb_cpu_s=_round(db_cpu, 2),
            sink_cpu_s=round(float(stats["cpu_s"]) - sink0, 2),
            other_cpu_s=None,
            rows_examined=mysqlstat.rows_examined(d),
            statements=mysqlstat.statements(d),
            questions=d.get("Questions", 0),
            sink_messages=int(stats["messages"]),
            sink_connections=int(stats["connections"]),
            sink_bytes=int(stats.get("bytes", 0)),
            detail={"counters": d},
        )
        result.detail["machine_busy_s"] = round(busy1 - busy0, 2)
        result.detail["package_digest"] = digest
        if package_digest() != digest:
            result.detail["package_changed_during_run"] = True
        return finished, result

    def _finish(self, result: Result, users: int, sent: int, duration: float) -> Result:
        result.users = users
        result.sent = sent
        result.duration_s = round(duration, 3)
        result.users_per_s = round(users / duration, 1) if duration > 0 else 0.0
        own = result.cpu_s + (result.mariadb_cpu_s or 0.0) + (result.sink_cpu_s or 0.0)
        result.other_cpu_s = round(max(0.0, result.detail["machine_busy_s"] - own), 2)
        tail = f"[red] exit {result.exit_code}[/]" if result.exit_code not in (0,) else ""
        console.print(
            f"  {result.label:<26} {result.users:>8,} users in {result.duration_s:8.2f} s"
            f" = {result.users_per_s:>8,.1f} users/s, rss {result.peak_rss_mb:6.1f} MB{tail}"
        )
        return result

    def batchrun(
        self,
        size: int,
        mail: str,
        label: str,
        job: str = "birthday",
        *,
        concurrency: int | None = None,
        sink: str | None = None,
    ) -> Result:
        """One run of ``job``: the built-in birthday, or the user-defined greeting.

        ``concurrency`` and ``sink`` (a name in ``lean_sinks``, the one ``mail`` points
        at): a row of the lean comparison; otherwise ``--concurrency`` and the bench's sink.
        """
        database = self.sizes[size]["database"]
        self.reset(database)
        cmd = [*self.launcher("batchrun"), "--db", self.server.db_url(database), "--mail", mail]
        if job == "birthday":
            cmd += ["birthday", "--month", MONTH]
        else:  # a user-defined job: loaded from its file, run by name
            cmd += ["--jobs", str(GREETING_JOB), "run", job, "--period", MONTH]
        cmd += ["--concurrency", str(concurrency or self.args.concurrency), "--json"]
        if self.args.page_size:
            cmd += ["--page-size", str(self.args.page_size)]
        finished, result = self.measure(label, size, cmd, self.lean_sinks[sink] if sink else None)
        if sink is not None:
            result.sink, result.concurrency = sink, concurrency
        if finished.code not in (0, 3):
            console.print(finished.stderr[-2000:], markup=False)
            lines = finished.stderr.strip().splitlines()
            result.detail["error"] = " ".join(lines[-3:])[-500:] if lines else ""
        summary = _last_json(finished.stdout) if finished.stdout.strip() else {}
        result.detail["summary"] = summary
        with self.server.connect(database) as conn:
            result.detail["cards_in_db"] = int(query(conn, "SELECT COUNT(*) FROM gift_card")[0][0])
        done = int(summary.get("emails_sent", 0)) + int(summary.get("skipped", 0))
        done += int(summary.get("failed", 0))
        return self._finish(
            result,
            done,
            int(summary.get("emails_sent", 0)),
            float(summary.get("duration_s", 0.0)),
        )

    def postgres(self, size: int, smtp: str) -> Result:
        """``batchrun birthday`` on PostgreSQL: a fresh database with the same users (same
        seed), the same sink; rows read and round trips from its own ``pg_stat_*``."""
        assert self.pg is not None
        server, name = self.pg, f"{self.args.db_prefix}{size}"
        url = server.db_url(name)
        with server.connect() as conn:
            pgstat.query(conn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            pgstat.query(conn, f'CREATE DATABASE "{name}"')
        try:
            console.print(f"[bold]{size:,} users[/]: PostgreSQL: migrate and seed {name} ...")
            _check(run_child([BATCHRUN, "--db", url, "db", "migrate"]), "db migrate (PostgreSQL)")
            seed = run_child(
                [BATCHRUN, "--db", url, "db", "seed", "--users", str(size), "--seed", "1"]
            )
            _check(seed, "batchrun db seed (PostgreSQL)")
            with server.connect(name) as conn:
                pgstat.query(conn, 'VACUUM ANALYZE "user"')
                eligible = int(
                    pgstat.query(
                        conn,
                        'SELECT COUNT(*) FROM "user" WHERE EXTRACT(MONTH FROM date_of_birth) = %s '
                        "AND status = 10 AND email IS NOT NULL",
                        (int(MONTH.split("-")[1]),),
                    )[0][0]
                )
                table_mb = pgstat.query(
                    conn, "SELECT pg_total_relation_size('\"user\"') / 1048576.0"
                )[0][0]
                pgstat.reset_stats(conn)
            with server.connect(name) as conn:
                before = pgstat.counters(conn, name)
            cmd = [*self.launcher("batchrun"), "--db", url, "--mail", smtp, "birthday"]
            cmd += ["--month", MONTH, "--concurrency", str(self.args.concurrency), "--json"]
            if self.args.page_size:
                cmd += ["--page-size", str(self.args.page_size)]
            sink0 = float(self.sink.command("reset")["cpu_s"])
            busy0 = mysqlstat.machine_busy_s()
            finished = run_child(cmd)
            busy1 = mysqlstat.machine_busy_s()
            sink = self.sink.command("stats")
            with server.connect(name) as conn:
                after = pgstat.counters(conn, name)
                cards = int(pgstat.query(conn, "SELECT COUNT(*) FROM gift_card")[0][0])
        finally:
            if not self.args.keep_db:
                with server.connect() as conn:
                    pgstat.query(conn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        d = {k: after[k] - before[k] for k in after}
        self.sizes[size]["postgresql"] = {
            "database": name,
            "seed_s": round(seed.wall_s, 2),
            "eligible": eligible,
            "user_table_mb": round(float(table_mb), 1),
        }
        summary = _last_json(finished.stdout) if finished.stdout.strip() else {}
        if finished.code not in (0, 3):
            console.print(finished.stderr[-2000:], markup=False)
        result = Result(
            contender="batchrun/postgresql",
            size=size,
            eligible=eligible,
            users=0,
            sent=0,
            duration_s=0.0,
            wall_s=round(finished.wall_s, 3),
            users_per_s=0.0,
            exit_code=finished.code,
            peak_rss_mb=round(finished.peak_rss_mb, 1),
            cpu_s=round(finished.cpu_s, 2),
            mariadb_cpu_s=None,
            sink_cpu_s=round(float(sink["cpu_s"]) - sink0, 2),
            other_cpu_s=None,
            rows_examined=d["rows_read"],
            statements=d["transactions"],
            questions=d["transactions"],
            sink_messages=int(sink["messages"]),
            sink_connections=int(sink["connections"]),
            sink_bytes=int(sink.get("bytes", 0)),
            detail={
                "counters": d,
                "summary": summary,
                "cards_in_db": cards,
                "machine_busy_s": round(busy1 - busy0, 2),
                "package_digest": package_digest(),
            },
        )
        done = sum(int(summary.get(k, 0)) for k in ("emails_sent", "skipped", "failed"))
        sent = int(summary.get("emails_sent", 0))
        self.results.append(result)
        return self._finish(result, done, sent, float(summary.get("duration_s", 0.0)))

    def launcher(self, target: str) -> list[str]:
        """The command that starts ``target`` (batchrun or a module) on the chosen loop;
        batchrun always through bench.loop, which sets its BATCHRUN_EVENT_LOOP."""
        if self.args.loop == "uvloop" or target == "batchrun":
            return [sys.executable, "-m", "bench.loop", self.args.loop, target]
        return [sys.executable, "-m", target]

    def ceiling(
        self, size: int, messages: int, shape: str = "birthday", *, lean: bool = False
    ) -> Result:
        """The bare sender, with messages of the birthday job's shape or greeting's
        (``lean``: sending each with batchrun's own SMTP transaction, not ``sendmail``)."""
        label = "ceiling/lean" if lean else "ceiling" if shape == "birthday" else f"ceiling/{shape}"
        cmd = [
            *self.launcher("bench.ceiling"),
            "--port",
            str(self.sink.port),
            "--messages",
            str(messages),
            "--concurrency",
            str(self.args.concurrency),
            "--shape",
            shape,
            *(["--lean"] if lean else []),
        ]
        finished, result = self.measure(label, size, cmd)
        _check(finished, "bench.ceiling")
        data = _last_json(finished.stdout)
        result.detail["ceiling"] = data
        return self._finish(
            result, int(data["messages"]), int(data["messages"]), float(data["duration_s"])
        )

    def lean(self, size: int, messages: int, sink: str, concurrency: int) -> Result:
        """The lean sender (``bench/lean.py``) against ``sink`` at ``concurrency``."""
        target = self.lean_sinks[sink]
        cmd = [*self.launcher("bench.lean"), "--port", str(target.port)]
        cmd += ["--messages", str(messages), "--concurrency", str(concurrency)]
        cmd += ["--shape", "birthday"]
        finished, result = self.measure("lean", size, cmd, target)
        result.sink, result.concurrency = sink, concurrency
        _check(finished, "bench.lean")
        data = _last_json(finished.stdout)
        result.detail["lean"] = data
        return self._finish(
            result, int(data["messages"]), int(data["messages"]), float(data["duration_s"])
        )

    def naive(self, size: int) -> Result:
        database = self.sizes[size]["database"]
        self.reset(database)
        index = self.args.naive_index
        # "seed": the seed's "为gift_card.scheduled_at和gift_card.recipient_email建立联合索引".
        columns = {
            "seed": "scheduled_at, recipient_email",
            "email-first": "recipient_email, scheduled_at",
        }
        if index in columns:
            with self.server.connect(database) as conn:
                query(conn, f"ALTER TABLE gift_card ADD INDEX {NAIVE_INDEX} ({columns[index]})")
        cmd = [
            sys.executable,
            "-m",
            "bench.naive",
            "--db",
            self.server.db_url(database),
            "--smtp-port",
            str(self.sink.port),
            "--month",
            MONTH,
        ]
        try:
            finished, result = self.measure("naive", size, cmd)
        finally:
            if index != "none":
                with self.server.connect(database) as conn:
                    query(conn, f"ALTER TABLE gift_card DROP INDEX {NAIVE_INDEX}")
        _check(finished, "bench.naive")
        data = _last_json(finished.stdout)
        result.detail["naive"] = data
        return self._finish(
            result, int(data["processed"]), int(data["sent"]), float(data["duration_s"])
        )

    def rows_by_statement(self, size: int, job: str = "birthday") -> dict[str, Any] | None:
        """An extra run of bench/rows.py: rows examined per statement, this session only."""
        database = self.sizes[size]["database"]
        cmd = [sys.executable, "-m", "bench.rows", "--db", self.server.db_url(database)]
        cmd += ["--reset", "--json", "--concurrency", str(self.args.concurrency)]
        if job != "birthday":
            cmd += ["--jobs", str(GREETING_JOB), "--job", job]
        finished = run_child(cmd)
        if finished.code != 0:
            console.print(f"  bench.rows failed: {finished.stderr[-500:]}", markup=False)
            return None
        data = _last_json(finished.stdout)
        parts = ", ".join(f"{name} {s['per_user']:.2f}" for name, s in data["by_statement"].items())
        console.print(
            f"  rows examined per user ({job}), session counters: "
            f"{data['rows_per_user']:.2f} ({parts})"
        )
        return data

    def profile(self, size: int, mail: str, label: str) -> str | None:
        """An extra, unmeasured batchrun run under py-spy; returns the summary."""
        spy = shutil.which("py-spy") or (str(BIN / "py-spy") if (BIN / "py-spy").exists() else None)
        if spy is None:
            console.print("  py-spy not found: pip install py-spy")
            return None
        out = Path(self.args.profile)
        out.mkdir(parents=True, exist_ok=True)
        database = self.sizes[size]["database"]
        self.reset(database)
        raw = out / f"batchrun-{size}-{label}.txt"
        cmd = [spy, "record", "--rate", "200", "--format", "raw", "-o", str(raw), "--"]
        cmd += [*self.launcher("batchrun"), "--db", self.server.db_url(database), "--mail", mail]
        cmd += ["birthday"]
        cmd += ["--month", MONTH, "--concurrency", str(self.args.concurrency), "--json"]
        run_child(cmd)
        from bench.profile import load, report

        text = report(load(str(raw)), 15)
        (out / f"batchrun-{size}-{label}.summary.txt").write_text(text + "\n")
        console.print(f"  profile of batchrun ({label}) at {size:,}: {raw}")
        return text

    # -- the whole run --------------------------------------------------------------------

    def run(self) -> None:
        args = self.args
        sizes = sorted(set(args.sizes) | set(args.naive_sizes) | set(args.lean_sizes))
        smtp = f"smtp://127.0.0.1:{self.sink.port}"
        for size in sizes:
            facts = self.prepare(size)
            console.print(f"[bold]{size:,} users[/]: {facts['eligible']:,} eligible in June")
            try:
                if size in args.sizes:
                    self._compare(size, smtp, int(facts["eligible"]))
                    if self.pg is not None:
                        self.postgres(size, smtp)
                if size in args.lean_sizes and self.lean_sinks:
                    self._lean_compare(size, int(facts["eligible"]))
                    postfix = self.lean_sinks.get("smtp-sink")
                    if args.profile and postfix is not None:
                        facts["profile_smtp_sink"] = self.profile(
                            size, f"smtp://127.0.0.1:{postfix.port}", "smtp-sink"
                        )
                if size in args.naive_sizes:
                    naive = [self.naive(size) for _ in range(self.args.naive_repeat)]
                    self._keep_best(naive)
                if size in args.sizes and not args.no_rows:
                    facts["rows_by_statement"] = self.rows_by_statement(size)
                    if not args.no_greeting:
                        facts["rows_by_statement_greeting"] = self.rows_by_statement(
                            size, "greeting"
                        )
                if args.profile and size in args.sizes:
                    facts["profile_smtp"] = self.profile(size, smtp, "smtp")
                    facts["profile_discard"] = self.profile(size, "discard://", "discard")
            finally:
                self.reset(facts["database"])
                if not args.keep_db:
                    self.drop(facts["database"])
        self._ratios()
        lean_ratios(self.lean_results)

    def _compare(self, size: int, smtp: str, eligible: int) -> None:
        """batchrun, the ceiling, greeting, its ceiling and batchrun/discard, ``--repeat``
        rounds of one run each.

        Round robin rather than each contender's repeats back to back: a change in what
        else the machine runs then falls on all of them alike, not on one of them; and
        each job runs right before the ceiling it is judged against.
        """
        rounds: dict[str, list[Result]] = {
            "batchrun": [],
            "discard": [],
            "ceiling": [],
            "ceiling/lean": [],
        }
        if not self.args.no_greeting:
            rounds["greeting"] = []
            rounds["ceiling/greeting"] = []
        for _ in range(self.args.repeat):
            rounds["batchrun"].append(self.batchrun(size, smtp, "batchrun"))
            messages = rounds["batchrun"][0].sent or eligible
            rounds["ceiling"].append(self.ceiling(size, messages))
            rounds["ceiling/lean"].append(self.ceiling(size, messages, lean=True))
            if "greeting" in rounds:
                rounds["greeting"].append(self.batchrun(size, smtp, "greeting", "greeting"))
                greeted = rounds["greeting"][0].sent or messages
                rounds["ceiling/greeting"].append(self.ceiling(size, greeted, "greeting"))
            rounds["discard"].append(self.batchrun(size, "discard://", "batchrun/discard"))
        for runs in rounds.values():
            self._keep_best(runs)

    def _lean_compare(self, size: int, eligible: int) -> None:
        """batchrun's birthday run and the lean sender on each sink at each
        ``--lean-concurrency``, ``--repeat`` rounds of one run each, the lean sender right
        after the batchrun run it is compared with; each one's fastest run is kept."""
        rounds: dict[tuple[str, str, int], list[Result]] = {}
        for _ in range(self.args.repeat):
            for sink, target in self.lean_sinks.items():
                mail = f"smtp://127.0.0.1:{target.port}"
                for c in self.args.lean_concurrency:
                    b = self.batchrun(size, mail, "batchrun", concurrency=c, sink=sink)
                    rounds.setdefault(("batchrun", sink, c), []).append(b)
                    lean = self.lean(size, b.sent or eligible, sink, c)
                    rounds.setdefault(("lean", sink, c), []).append(lean)
        self.lean_results += [self._best(runs) for runs in rounds.values()]

    def _keep_best(self, runs: list[Result]) -> Result:
        """Keep a contender's fastest run of ``runs`` (the least disturbed one)."""
        best = self._best(runs)
        self.results.append(best)
        return best

    def _best(self, runs: list[Result]) -> Result:
        """A contender's fastest run of ``runs``, with the others' rates and failures."""
        best = max(runs, key=lambda r: (r.exit_code in (0, 3), r.users_per_s))
        if len(runs) > 1:
            best.detail["repeats_users_per_s"] = [r.users_per_s for r in runs]
        failed = [r for r in runs if r.exit_code not in (0, 3)]
        if failed:
            best.detail["failed_runs"] = [
                {"exit_code": r.exit_code, "error": r.detail.get("error", "")} for r in failed
            ]
        return best

    def _ratios(self) -> None:
        by = {(r.contender, r.size): r for r in self.results}
        for r in self.results:
            naive = by.get(("naive", r.size))
            ceiling = by.get(("ceiling", r.size))
            if naive and naive.users_per_s:
                r.vs_naive = round(r.users_per_s / naive.users_per_s, 2)
            if ceiling and ceiling.users_per_s:
                r.vs_ceiling = round(r.users_per_s / ceiling.users_per_s, 3)
            # batchrun's SMTP mailer skips sendmail's re-parsing (mail/smtp_transaction.py);
            # the ceiling sending the same way shows what the runtime itself costs.
            lean = by.get(("ceiling/lean", r.size))
            if r.contender == "batchrun" and lean and lean.users_per_s:
                r.detail["vs_lean_ceiling"] = round(r.users_per_s / lean.users_per_s, 3)
            # A contender's own ceiling sends messages of its size: greeting's are a ninth
            # of the birthday's, and the birthday-shaped ceiling would flatter it.
            own = by.get((f"ceiling/{r.contender}", r.size))
            if own and own.users_per_s:
                r.detail["vs_birthday_ceiling"] = r.vs_ceiling
                r.vs_ceiling = round(r.users_per_s / own.users_per_s, 3)

    def close(self) -> None:
        self.sink.close()
        for sink in self.lean_sinks.values():
            if sink is not self.sink:
                sink.close()


# -- reporting ------------------------------------------------------------------------------


def naive_growth(results: list[Result]) -> dict[str, Any] | None:
    """How the naive algorithm's time per user grows with N (fitted between the ends)."""
    naive = sorted((r for r in results if r.contender == "naive"), key=lambda r: r.size)
    if len(naive) < 2 or not naive[0].users_per_s or not naive[-1].users_per_s:
        return None
    import math

    a, b = naive[0], naive[-1]
    per_user = (1 / b.users_per_s) / (1 / a.users_per_s)
    exponent = math.log(per_user) / math.log(b.size / a.size)
    return {
        "sizes": [r.size for r in naive],
        "users_per_s": [r.users_per_s for r in naive],
        "time_per_user_exponent": round(exponent, 2),
        "total_time_exponent": round(exponent + 1, 2),
        "text": (
            f"naive: {a.users_per_s:,.0f} users/s at {a.size:,} -> {b.users_per_s:,.0f} at "
            f"{b.size:,}; time per user ~ N^{exponent:.2f}, whole month ~ N^{exponent + 1:.2f}"
        ),
    }


def targets(
    results: list[Result], sizes_facts: dict[int, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The issue's targets, at every size that was measured.

    Rows examined are judged on the session-level count of bench/rows.py when it ran
    (other sessions cannot inflate it); the global-counter figure is shown beside it.
    """
    by = {(r.contender, r.size): r for r in results}
    sizes = sorted({r.size for r in results if r.contender == "batchrun"})
    out: list[dict[str, Any]] = []

    def add(name: str, ok: bool | None, value: str) -> None:
        out.append({"target": name, "pass": ok, "value": value})

    for n in sizes:
        b = by[("batchrun", n)]
        if b.vs_naive is not None:
            add(f"batchrun >= 10x naive users/s at {n:,}", b.vs_naive >= 10, f"{b.vs_naive:.1f}x")
        if b.vs_ceiling is not None:
            add(
                f"batchrun >= {100 * CEILING_TARGET:.0f}% of the ceiling at {n:,}",
                b.vs_ceiling >= CEILING_TARGET,
                f"{100 * b.vs_ceiling:.0f}%",
            )
        g = by.get(("greeting", n))
        if g is not None:
            text = f"{g.users_per_s:,.0f} users/s"
            if g.vs_ceiling is not None:
                text += f", {100 * g.vs_ceiling:.0f}% of its ceiling (same message size)"
            if g.detail.get("vs_birthday_ceiling") is not None:
                text += f", {100 * g.detail['vs_birthday_ceiling']:.0f}% of birthday's ceiling"
            if b.users_per_s:
                text += f"; {g.users_per_s / b.users_per_s:.2f}x birthday"
            add(
                f"the user-defined job (greeting) measured beside birthday at {n:,}",
                g.exit_code == 0 and g.users_per_s > 0,
                text,
            )
        rows = _session_rows(sizes_facts, n)
        shown = f"{rows:.2f} (session)" if rows is not None else ""
        if b.rows_per_user is not None:
            shown += f"{'; ' if shown else ''}{b.rows_per_user:.2f} (global counters)"
        if rows is None:
            rows = b.rows_per_user
        add(
            f"<= 3 rows examined per eligible user at {n:,}",
            rows is not None and rows <= 3,
            shown or "n/a",
        )
    if len(sizes) >= 2:
        lo, hi = by[("batchrun", sizes[0])], by[("batchrun", sizes[-1])]
        lo_rows = _session_rows(sizes_facts, sizes[0]) or lo.rows_per_user
        hi_rows = _session_rows(sizes_facts, sizes[-1]) or hi.rows_per_user
        if lo_rows and hi_rows:
            growth = hi_rows / lo_rows
            add(
                f"rows examined per user independent of N ({sizes[0]:,} -> {sizes[-1]:,})",
                growth <= 1.25,
                f"x{growth:.2f}",
            )
        rss = hi.peak_rss_mb / lo.peak_rss_mb if lo.peak_rss_mb else 0
        add(
            f"peak RSS at {sizes[-1]:,} within 20% of {sizes[0]:,}",
            rss <= 1.2,
            f"{hi.peak_rss_mb:.0f} vs {lo.peak_rss_mb:.0f} MB (x{rss:.2f})",
        )
    for n in sizes:
        b = by[("batchrun", n)]
        add(f"peak RSS under 200 MB at {n:,}", b.peak_rss_mb < 200, f"{b.peak_rss_mb:.0f} MB")
    for n in sizes:
        d = by.get(("batchrun/discard", n))
        if d is not None:
            add(
                f"discard mailer >= 5,000 users/s at {n:,}",
                d.users_per_s >= 5000,
                f"{d.users_per_s:,.0f} users/s",
            )
    return out


def _session_rows(sizes_facts: dict[int, dict[str, Any]] | None, size: int) -> float | None:
    data = (sizes_facts or {}).get(size, {}).get("rows_by_statement")
    return float(data["rows_per_user"]) if data else None


def lean_ratios(results: list[Result]) -> list[dict[str, Any]]:
    """batchrun's users/s over the lean sender's, per (size, sink, concurrency), with each
    one's CPU per entity (also stored as ``detail.vs_lean`` of the batchrun row)."""
    by = {(r.contender, r.size, r.sink, r.concurrency): r for r in results}
    out = []
    for r in sorted(results, key=lambda r: (r.size, r.sink or "", r.concurrency or 0)):
        lean = by.get(("lean", r.size, r.sink, r.concurrency))
        if r.contender != "batchrun" or lean is None or not lean.users_per_s:
            continue
        r.detail["vs_lean"] = ratio = round(r.users_per_s / lean.users_per_s, 3)
        out.append(
            {
                "size": r.size,
                "sink": r.sink,
                "concurrency": r.concurrency,
                "batchrun_users_per_s": r.users_per_s,
                "lean_users_per_s": lean.users_per_s,
                "ratio": ratio,
                "batchrun_cpu_ms_per_entity": _round(r.cpu_ms_per_entity, 4),
                "lean_cpu_ms_per_entity": _round(lean.cpu_ms_per_entity, 4),
                **_bound(r, lean),
            }
        )
    return out


def _bound(r: Result, lean: Result) -> dict[str, Any]:
    """The most batchrun could reach on this machine if its own process cost nothing: the
    database and the sink must still do their part of each entity, on the cores this
    process may use (``bound_users_per_s``; as a share of the lean sender, ``bound_ratio``)."""
    others = (r.mariadb_cpu_s or 0.0) + (r.sink_cpu_s or 0.0)
    if not others or not r.users or not lean.users_per_s:
        return {}
    bound = _cores() * r.users / others
    return {"bound_users_per_s": round(bound, 1), "bound_ratio": round(bound / lean.users_per_s, 3)}


def lean_goals(ratios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals for the lean comparison, judged against smtp-sink only (the bench's
    sink, with its latency, bounds both senders at low concurrency)."""
    out: list[dict[str, Any]] = []
    for x in ratios:
        if x["sink"] != "smtp-sink":
            continue
        at = f"against smtp-sink at concurrency {x['concurrency']}, {x['size']:,} users"
        out.append(
            {
                "target": f"batchrun >= {100 * LEAN_TARGET:.0f}% of the lean sender {at}",
                "pass": x["ratio"] >= LEAN_TARGET,
                "value": f"{100 * x['ratio']:.0f}% ({x['batchrun_users_per_s']:,.0f} vs "
                f"{x['lean_users_per_s']:,.0f} users/s)" + _bound_words(x),
            }
        )
        cpu, lean_cpu = x["batchrun_cpu_ms_per_entity"], x["lean_cpu_ms_per_entity"]
        out.append(
            {
                "target": f"batchrun's CPU <= {LEAN_CPU_MS_TARGET} ms per entity {at}",
                "pass": cpu is not None and cpu <= LEAN_CPU_MS_TARGET,
                "value": f"{_fmt(cpu, '{:.3f}')} ms (lean sender {_fmt(lean_cpu, '{:.3f}')} ms)",
            }
        )
    return out


def _cores() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _bound_words(x: dict[str, Any]) -> str:
    if "bound_ratio" not in x:
        return ""
    return (
        f"; at most {100 * x['bound_ratio']:.0f}% on these {_cores()} cores even if "
        f"batchrun's own CPU were zero (mariadbd's and the sink's CPU per entity)"
    )


def checks(results: list[Result]) -> list[dict[str, Any]]:
    """Consistency of each run: one email per user sent, one card per user."""
    out: list[dict[str, Any]] = []
    for r in results:
        name = f"{r.label} at {r.size:,}"
        summary = r.detail.get("summary", {})
        if r.contender in ("batchrun", "batchrun/postgresql"):
            out.append(
                {
                    "check": f"{name}: sink received = emails_sent = cards in db",
                    "pass": r.sink_messages == r.sent == r.detail.get("cards_in_db"),
                    "value": f"{r.sink_messages} / {r.sent} / {r.detail.get('cards_in_db')}",
                }
            )
        if r.contender == "greeting":
            out.append(
                {
                    "check": f"{name}: sink received = emails_sent; no cards",
                    "pass": r.sink_messages == r.sent and r.detail.get("cards_in_db") == 0,
                    "value": f"{r.sink_messages} / {r.sent} / {r.detail.get('cards_in_db')}",
                }
            )
        if r.contender == "batchrun/discard":
            out.append(
                {
                    "check": f"{name}: nothing reached the sink; cards = emails_sent",
                    "pass": r.sink_messages == 0 and r.sent == r.detail.get("cards_in_db"),
                    "value": f"{r.sink_messages} / {r.sent} / {r.detail.get('cards_in_db')}",
                }
            )
        if r.contender.startswith("batchrun") or r.contender == "greeting":
            out.append(
                {
                    "check": f"{name}: every eligible user done, exit 0",
                    "pass": r.exit_code == 0 and summary.get("eligible") == r.eligible,
                    "value": f"exit {r.exit_code}, eligible {summary.get('eligible')}",
                }
            )
        for failure in r.detail.get("failed_runs", []):
            out.append(
                {
                    "check": f"{name}: every repeat succeeded",
                    "pass": False,
                    "value": f"a run exited {failure['exit_code']}: {failure['error']}",
                }
            )
        if r.contender.startswith("ceiling") or r.contender in ("naive", "lean"):
            out.append(
                {
                    "check": f"{name}: sink received what it sent",
                    "pass": r.sink_messages == r.sent,
                    "value": f"{r.sink_messages} / {r.sent}",
                }
            )
    return out


def render(
    results: list[Result],
    sizes: dict[int, dict[str, Any]],
    args: argparse.Namespace,
    lean: list[Result] | None = None,
) -> None:
    """The tables (the main one, the lean comparison) and the target lines, on stdout."""
    out = Console(width=max(Console().width, 200))
    lean = lean or []
    if results:
        out.print(main_table(results, args))
    if lean:
        out.print(lean_table(lean, args))
    _render_notes(out, results, sizes, lean)


def main_table(results: list[Result], args: argparse.Namespace) -> Table:
    """Every contender but the lean comparison's, by size."""
    table = Table(
        title=f"batchrun bench: June, SMTP latency {args.latency_ms:g} ms, "
        f"concurrency {args.concurrency} (naive: 20), {args.loop} event loop",
        show_lines=False,
    )
    for name in (
        "N users",
        "contender",
        "eligible",
        "done",
        "seconds",
        "users/s",
        "x naive",
        "% ceiling",
        "rows ex./user",
        "trips/user",
        "peak RSS MB",
        "msg bytes",
        "CPU s",
        "CPU ms/user",
        "db CPU s",
        "sink CPU s",
        "other CPU s",
    ):
        if name == "contender":  # never cut: the widest is "batchrun/postgresql"
            table.add_column(name, justify="left", min_width=19, no_wrap=True)
        else:
            table.add_column(name, justify="right")
    order = {
        "batchrun": 0,
        "batchrun/discard": 1,
        "batchrun/postgresql": 1.5,
        "ceiling": 2,
        "ceiling/lean": 3,
        "greeting": 4,
        "ceiling/greeting": 5,
        "naive": 6,
    }
    for r in sorted(results, key=lambda r: (r.size, order.get(r.contender, 9))):
        table.add_row(
            f"{r.size:,}",
            r.contender,
            f"{r.eligible:,}",
            f"{r.users:,}",
            f"{r.duration_s:.2f}",
            f"{r.users_per_s:,.0f}",
            _fmt(r.vs_naive, "{:.1f}x"),
            _fmt(
                None
                if r.vs_ceiling is None
                or r.contender.endswith("discard")
                or r.contender.startswith("ceiling/")
                else 100 * r.vs_ceiling,
                "{:.0f}%",
            ),
            _fmt(r.rows_per_user, "{:.2f}"),
            _fmt(r.trips_per_user, "{:.3f}"),
            f"{r.peak_rss_mb:.0f}",
            _fmt(r.message_bytes, "{:,.0f}"),
            f"{r.cpu_s:.1f}",
            _fmt(r.cpu_ms_per_entity, "{:.3f}"),
            _fmt(r.mariadb_cpu_s, "{:.1f}"),
            _fmt(r.sink_cpu_s, "{:.1f}"),
            _fmt(r.other_cpu_s, "{:.1f}"),
        )
    return table


def lean_table(results: list[Result], args: argparse.Namespace) -> Table:
    """The lean comparison: batchrun and the lean sender per sink and concurrency."""
    table = Table(
        title="lean comparison: batchrun's birthday run vs the lean sender (bench/lean.py), "
        f"same sink; bench sink {args.latency_ms:g} ms latency, smtp-sink none; "
        f"{args.loop} event loop",
        show_lines=False,
    )
    for name in (
        "N users",
        "sink",
        "conc.",
        "contender",
        "done",
        "seconds",
        "users/s",
        "% lean",
        "CPU s",
        "CPU ms/entity",
        "peak RSS MB",
        "msg bytes",
        "db CPU s",
        "sink CPU s",
        "other CPU s",
    ):
        table.add_column(name, justify="left" if name in ("sink", "contender") else "right")
    for r in sorted(
        results, key=lambda r: (r.size, r.sink or "", r.concurrency or 0, r.contender != "lean")
    ):
        ratio = r.detail.get("vs_lean")
        table.add_row(
            f"{r.size:,}",
            r.sink,
            str(r.concurrency),
            r.contender,
            f"{r.users:,}",
            f"{r.duration_s:.2f}",
            f"{r.users_per_s:,.0f}",
            _fmt(None if ratio is None else 100 * ratio, "[bold]{:.0f}%[/]"),
            f"{r.cpu_s:.2f}",
            _fmt(r.cpu_ms_per_entity, "{:.3f}"),
            f"{r.peak_rss_mb:.0f}",
            _fmt(r.message_bytes, "{:,.0f}"),
            _fmt(r.mariadb_cpu_s if r.is_db else None, "{:.1f}"),
            _fmt(r.sink_cpu_s, "{:.1f}"),
            _fmt(r.other_cpu_s, "{:.1f}"),
        )
    return table


def _render_notes(
    out: Console,
    results: list[Result],
    sizes: dict[int, dict[str, Any]],
    lean: list[Result],
) -> None:
    """Seeding facts, naive growth, targets and goals, warnings and failed checks."""
    for size, facts in sorted(sizes.items()):
        seeded = f"{facts['seed_s']:.1f} s" if facts.get("seed_s") is not None else "reused"
        out.print(
            f"  {size:,} users: seeded with `batchrun db seed` in {seeded}; user table "
            f"{facts['user_table_mb']} MB",
            highlight=False,
        )
        pg = facts.get("postgresql")
        if pg:
            out.print(
                f"  {size:,} users on PostgreSQL: seeded in {pg['seed_s']:.1f} s; user table "
                f"{pg['user_table_mb']} MB; rows read from pg_stat_user_tables/_indexes",
                highlight=False,
            )
    growth = naive_growth(results)
    if growth:
        out.print("  " + growth["text"], highlight=False)
    for t in targets(results, sizes) + lean_goals(lean_ratios(lean)):
        mark = "[green]PASS[/]" if t["pass"] else "[red]FAIL[/]"
        out.print(f"{mark}  {t['target']}: {t['value']}", highlight=False)
    results = results + lean
    digests = {
        r.detail.get("package_digest")
        for r in results
        if r.contender.startswith("batchrun") or r.contender == "greeting"
    }
    changed = [r for r in results if r.detail.get("package_changed_during_run")]
    if len(digests) > 1 or changed:
        out.print(
            "[red]WARNING[/]: batchrun's source changed during the benchmark "
            f"(digests {', '.join(sorted(str(d) for d in digests))}): the numbers mix versions",
            highlight=False,
        )
    for c in checks(results):
        if not c["pass"]:
            out.print(f"[red]CHECK FAILED[/]  {c['check']}: {c['value']}", highlight=False)
    others = [r for r in results if (r.other_cpu_s or 0) > 0.25 * max(r.duration_s, 0.1)]
    if others:
        out.print(
            "[yellow]note:[/] other processes used the CPU during "
            + ", ".join(f"{r.label}@{r.size:,}" for r in others)
            + " (see 'other CPU s'); their numbers are noisier",
            highlight=False,
        )


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _check(finished: Finished, what: str) -> None:
    if finished.code != 0:
        raise SystemExit(f"{what} failed (exit {finished.code}): {finished.stderr[-2000:]}")


def _sizes(text: str) -> list[int]:
    return [int(float(p)) for p in text.replace("_", "").split(",") if p.strip()]


def _names(choices: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        names = [p.strip() for p in text.split(",") if p.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not one of {choices}")
        return names

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sizes", type=_sizes, default=[100_000, 1_000_000])
    parser.add_argument("--naive-sizes", type=_sizes, default=[20_000, 100_000])
    parser.add_argument(
        "--lean-sizes",
        type=_sizes,
        default=None,
        help="sizes of the lean comparison (batchrun vs bench/lean.py per sink and "
        "concurrency; default: the largest of --sizes; '' for none)",
    )
    parser.add_argument(
        "--lean-only",
        action="store_true",
        help="run only the lean comparison, at --sizes (no ceiling, greeting, discard, "
        "naive, PostgreSQL or rows run)",
    )
    parser.add_argument(
        "--lean-concurrency",
        type=_sizes,
        default=list(LEAN_CONCURRENCY),
        help="concurrencies of the lean comparison (default %(default)s)",
    )
    parser.add_argument(
        "--lean-sinks",
        type=_names(LEAN_SINKS),
        default=list(LEAN_SINKS),
        help="sinks of the lean comparison: bench (bench/smtp_sink.py, --latency-ms) and "
        f"smtp-sink (Postfix's, {postfix_sink.SMTP_SINK}, no latency); default both",
    )
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="batchrun's --concurrency and the ceiling's connections (default %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of batchrun, discard and ceiling runs; each one's fastest is kept",
    )
    parser.add_argument(
        "--naive-repeat", type=int, default=1, help="runs of the (slow) naive algorithm"
    )
    parser.add_argument("--page-size", type=int, default=None, help="batchrun's --page-size")
    parser.add_argument("--json", dest="json_path", default=None, help="write results here")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 20k users; naive at 5k and 20k"
    )
    parser.add_argument(
        "--mysql", default=os.environ.get("BENCH_MYSQL", "mysql://root:@127.0.0.1:3306/")
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/"),
        help="PostgreSQL server for the batchrun/postgresql rows",
    )
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL rows")
    parser.add_argument("--db-prefix", default="batchrun_bench_")
    parser.add_argument("--keep-db", action="store_true", help="keep the databases")
    parser.add_argument(
        "--reuse-db", action="store_true", help="reuse a kept database of the right size"
    )
    parser.add_argument(
        "--naive-index",
        choices=("seed", "none", "email-first"),
        default="seed",
        help="index for the naive run: the seed's gift_card(scheduled_at, recipient_email)",
    )
    parser.add_argument(
        "--no-rows", action="store_true", help="skip the per-statement rows run (bench/rows.py)"
    )
    parser.add_argument(
        "--no-greeting",
        action="store_true",
        help="skip the user-defined job (bench/greeting_job.py) beside birthday",
    )
    parser.add_argument("--sink", choices=("fast", "aiosmtpd"), default="fast")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of batchrun and the ceiling (the naive port stays on asyncio)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="also profile batchrun with py-spy into DIR (smtp and discard at --sizes; "
        "against smtp-sink at --lean-sizes)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.naive_sizes = [20_000], [5_000, 20_000]
    if args.lean_only:
        args.lean_sizes, args.sizes, args.naive_sizes = args.sizes, [], []
        args.no_postgres = True
    elif args.lean_sizes is None:
        args.lean_sizes = [max(args.sizes)] if args.sizes else []
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark, print the table, write the JSON."""
    args = parse_args(argv)
    started = time.monotonic()
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.close()
    render(bench.results, bench.sizes, args, bench.lean_results)
    with Server(args.mysql).connect() as conn:
        version = str(query(conn, "SELECT VERSION()")[0][0])
        pool_mb = int(query(conn, "SELECT @@innodb_buffer_pool_size")[0][0]) // 2**20
        flush = int(query(conn, "SELECT @@innodb_flush_log_at_trx_commit")[0][0])
    data = {
        "meta": {
            "month": MONTH,
            "latency_ms": args.latency_ms,
            "concurrency": args.concurrency,
            "event_loop": args.loop,
            "naive_concurrency": 20,
            "naive_index": args.naive_index,
            "sink": args.sink,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "mariadb": version,
            "innodb_buffer_pool_mb": pool_mb,
            "innodb_flush_log_at_trx_commit": flush,
            "loadavg_end": os.getloadavg(),
            "counter_noise_per_read": bench.noise,
            "git_commit": _git_commit(),
            "package_digest_end": package_digest(),
            "git_dirty": _git_dirty(),
            "total_s": round(time.monotonic() - started, 1),
            "note": "database counters are GLOBAL: other sessions' work is included",
        },
        "sizes": {str(k): v for k, v in sorted(bench.sizes.items())},
        "results": [r.to_json() for r in bench.results],
        "naive_growth": naive_growth(bench.results),
        "targets": targets(bench.results, bench.sizes),
        "lean_comparison": {
            "sizes": args.lean_sizes,
            "concurrency": args.lean_concurrency,
            "sinks": sorted(bench.lean_sinks),
            "skipped": bench.lean_skipped,
            "results": [r.to_json() for r in bench.lean_results],
            "ratios": lean_ratios(bench.lean_results),
            "goals": lean_goals(lean_ratios(bench.lean_results)),
        },
        "checks": checks(bench.results + bench.lean_results),
    }
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {args.json_path}")


def package_digest() -> str:
    """A digest of batchrun's source (.py and .sql): which code a number belongs to."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "batchrun").rglob("*")):
        if path.suffix in (".py", ".sql") and path.is_file():
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _git_dirty() -> list[str]:
    """Package files changed since the commit (the numbers are of the working tree)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", "batchrun", "pyproject.toml"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line[3:] for line in out.splitlines()]


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    main()

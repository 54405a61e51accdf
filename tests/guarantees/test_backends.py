"""Named backends: ``batchrun.Backend`` and its pieces (unit
tests, fake clocks), then real servers: a shared slot across processes and a killed
holder, a busy backend (seed 001, ``examples/busy_backend``) behind ``batchrun worker``
processes and behind the SQS-triggered Lambda, and busy give-backs that never reach a
dead-letter queue, however long the backend stays busy.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.aws_server import MotoServer, aws_client, make_queue_with_dlq
from support.cli import run_cli
from support.db import query
from support.lambda_context import FakeContext
from support.tasks import EFFECT, JOBS, effects

import batchrun
from batchrun.backend import Backend, check_backends
from batchrun.db import Store, connect
from batchrun.effects.backends import AUTO_START, BackendPool, limiter
from batchrun.errors import ConfigError, UsageError
from batchrun.pipeline.apply import Disposition
from batchrun.pipeline.consume import give_back
from batchrun.pipeline.run import Options
from batchrun.policy.busy import GIVE_BACK_MAX_S, busy_delay_s
from batchrun.policy.gate import BackendGate
from batchrun.policy.pacing import CircuitBreaker
from batchrun.policy.rate import AdaptiveRate
from batchrun.queue.base import QueueMessage, Received
from batchrun.registry import check_job
from batchrun.runtime import Runtime
from batchrun.settings import Settings, backend_env

EXAMPLE = ROOT / "examples" / "busy_backend"
sys.path.insert(0, str(EXAMPLE))
from backend import BusyBackend  # noqa: E402  (examples/ is not a package)

FILES_JOB = str(EXAMPLE / "busy_backend.py")


# -- Backend: the declaration ---------------------------------------------------------------


async def _ready(ctx: batchrun.Context) -> bool:
    return True


def test_a_backend_takes_its_figures_and_refuses_what_is_not_one() -> None:
    backend = Backend(concurrency=2, rate="auto", shared=True, ready=_ready, ready_every_s=0.5)
    assert (backend.concurrency, backend.rate, backend.shared) == (2, "auto", True)
    assert Backend().concurrency is None and Backend(rate=2.5).rate == 2.5
    for bad, error in (
        ({"concurrency": 0}, ValueError),
        ({"concurrency": 1.5}, TypeError),
        ({"concurrency": True}, TypeError),
        ({"rate": 0}, ValueError),
        ({"rate": float("inf")}, ValueError),
        ({"rate": "fast"}, TypeError),
        ({"rate": True}, TypeError),
        ({"shared": True}, ValueError),  # shared without a concurrency: nothing to share
        ({"shared": "yes", "concurrency": 1}, TypeError),
        ({"ready": "http://x/status"}, TypeError),
        ({"ready_every_s": 0}, ValueError),
        ({"ready_every_s": -1.0}, ValueError),
    ):
        with pytest.raises(error):
            Backend(**bad)


def test_a_job_whose_backends_are_not_backends_is_refused_in_one_line() -> None:
    assert check_backends({"credits": Backend()}) is None
    assert "does not match" in (check_backends({"Credits API": Backend()}) or "")
    assert "is not a batchrun.Backend" in (check_backends({"api": {"rate": 5}}) or "")
    assert "dict of name" in (check_backends([Backend()]) or "")

    class Broken(batchrun.Job):
        name = "broken"
        backends = {"api": 5}  # type: ignore[dict-item]

        async def page(self, ctx: Any, after: int, limit: int) -> list[dict[str, Any]]:
            return []

        async def process(self, ctx: Any, row: Any) -> None:
            pass

    with pytest.raises(UsageError, match=r"Broken: backend 'api' is not a batchrun.Backend"):
        check_job(Broken)


# -- the deployment's figures ----------------------------------------------------------------


def test_the_environment_overrides_one_backend_by_its_name() -> None:
    env = {
        "BATCHRUN_BACKEND_MY_API_URL": "https://api.internal/v1",
        "BATCHRUN_BACKEND_MY_API_RATE": "5",
        "BATCHRUN_BACKEND_MY_API_CONCURRENCY": "3",
        "BATCHRUN_BACKEND_MY_API_TIMEOUT_S": "2.5",
        "BATCHRUN_BACKEND_OTHER_RATE": "auto",
    }
    settings = Settings.from_env(env)
    figures = settings.backend("my-api")  # upper case, "-" as "_"
    assert (figures.url, figures.rate, figures.concurrency, figures.timeout_s) == (
        "https://api.internal/v1",
        5.0,
        3,
        2.5,
    )
    assert settings.backend("other").rate == "auto"
    assert settings.backend("unset") == backend_env({}, "unset")
    assert settings.backend("unset").url is None
    for name, value, said in (
        ("RATE", "fast", "BATCHRUN_BACKEND_X_RATE"),
        ("RATE", "-1", "BATCHRUN_BACKEND_X_RATE"),
        ("CONCURRENCY", "0", "BATCHRUN_BACKEND_X_CONCURRENCY"),
        ("URL", "ftp://x", "BATCHRUN_BACKEND_X_URL"),
    ):
        with pytest.raises(ConfigError, match=said):
            backend_env({f"BATCHRUN_BACKEND_X_{name}": value}, "x")


def test_the_pool_applies_the_overrides_and_the_rate_cap() -> None:
    class Calls(batchrun.Job):
        name = "calls"
        backends = {"api": Backend(concurrency=8, rate=50)}

    env = {"BATCHRUN_BACKEND_API_CONCURRENCY": "2", "BATCHRUN_BACKEND_API_RATE": "30"}
    pool = BackendPool(Settings.from_env(env), None)
    pool.cap = 20.0  # --rate 20: the lower wins
    gate = pool.gate(Calls(), "api")
    assert gate.backend.concurrency == 2 and gate.backend.rate == 30
    assert gate.limiter is not None and gate.limiter.rate == 20 and gate.limiter.ceiling == 20
    assert pool.gate(Calls(), "api") is gate  # one gate per name for the runtime's life
    with pytest.raises(LookupError, match="declares no backend 'nope'"):
        pool.gate(Calls(), "nope")


def test_a_backends_rate_and_the_rate_option_combine_the_lower_winning() -> None:
    def shown(own: Any, cap: Any) -> tuple[float | None, float | None] | None:
        made = limiter(own, cap)
        return None if made is None else (made.rate, made.ceiling)

    assert shown(None, None) is None  # no rate at all
    assert shown(50, None) == (50, 50)
    assert shown(50, 20) == (20, 20)
    assert shown(10, 20) == (10, 10)
    assert shown(50, "auto") == (50, 50)  # auto does not lift a number
    assert shown(None, 20) == (20, 20)
    assert shown("auto", None) == (AUTO_START, None)  # found by slow start, then AIMD
    assert shown("auto", 5) == (5, 5)
    assert shown(None, "auto") == (AUTO_START, None)


# -- busy: how long a message waits on its queue -------------------------------------------


def test_the_busy_delay_doubles_while_the_backend_stays_busy_up_to_a_bound() -> None:
    random.seed(7)
    for times in range(1, 12):
        ceiling = min(GIVE_BACK_MAX_S, 2 ** (times - 1))
        for _ in range(50):
            assert ceiling / 2 <= busy_delay_s(times) <= ceiling
    assert busy_delay_s(1, asked_s=30.0) == 30.0  # a Retry-After is at least waited
    assert busy_delay_s(20, asked_s=99_999.0) == GIVE_BACK_MAX_S


def test_a_busy_message_goes_back_counted_in_its_body() -> None:
    units = {"files": "day", "credits": "month"}
    task = QueueMessage("entity_task", "files", "", entity_id=7, key="k-1")
    busy = Disposition("later", "busy", delay_s=0.0, counted=False, keep=True, busy=True)
    first = give_back(busy, Received("m1", "r1", task.to_json(), 1), task)
    assert first.body is not None and 0.5 <= first.delay_s <= 1.0
    again = QueueMessage.from_json(first.body, units)  # type: ignore[arg-type]
    assert again == QueueMessage("entity_task", "files", "", entity_id=7, key="k-1", busy=1)
    # A fresh copy comes back with receive count 1: the count in its body grows the delay.
    second = give_back(busy, Received("m2", "r2", first.body, 1), again)
    assert second.body is not None and 1.0 <= second.delay_s <= 2.0
    assert json.loads(second.body)["busy"] == 2
    # A FIFO queue hides the message itself: its receives count too.
    hidden = give_back(busy, Received("m1", "r3", first.body, 3), again)
    assert hidden.body is not None and json.loads(hidden.body)["busy"] == 4
    # The backend's Retry-After is waited at least.
    asked = give_back(
        Disposition("later", busy=True, delay_s=40.0), Received("m", "r", "", 1), task
    )
    assert asked.delay_s == 40.0
    retry = QueueMessage("retry", "credits", "2025-06", entity_id=3, attempt=1, busy=2)
    assert QueueMessage.from_json(retry.to_json(), units) == retry  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad busy"):
        QueueMessage.from_json(
            '{"kind":"entity_task","job":"files","id":1,"key":"k","busy":-1}', units
        )  # type: ignore[arg-type]


# -- the ready probe: its answers, on a fake clock --------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Probe:
    """A ready probe that counts its calls and answers what it is told."""

    def __init__(self) -> None:
        self.calls = 0
        self.answer: bool | Exception = True

    async def __call__(self, ctx: Any) -> bool:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def gate_of(backend: Backend, clock: Clock) -> BackendGate:
    return BackendGate("api", backend, limiter=None, breaker=CircuitBreaker(5), clock=clock)


async def call(gate: BackendGate) -> bool:
    """One call through the gate outside the road (it waits for nothing): whether it went."""
    try:
        async with gate.call(None):  # type: ignore[arg-type]
            return True
    except batchrun.Busy:
        return False


async def test_a_ready_answer_serves_calls_for_ready_every_s() -> None:
    clock, probe = Clock(), Probe()
    gate = gate_of(Backend(ready=probe, ready_every_s=1.0), clock)
    assert [await call(gate) for _ in range(3)] == [True, True, True]
    assert probe.calls == 1  # one answer for the three
    clock.now += 0.99
    assert await call(gate) and probe.calls == 1
    clock.now += 0.02
    assert await call(gate) and probe.calls == 2  # older than ready_every_s: asked again
    probe.answer = False
    clock.now += 1.5
    assert not await call(gate) and probe.calls == 3  # not ready: busy, no call made
    assert not await call(gate) and probe.calls == 3  # and not asked again before 1 s
    probe.answer = RuntimeError("status endpoint down")
    clock.now += 1.0
    assert not await call(gate) and probe.calls == 4  # a probe that fails: not ready
    assert (gate.calls, gate.busy_waits) == (5, 3)


async def test_with_concurrency_1_every_call_asks_afresh_but_not_sooner() -> None:
    clock, probe = Clock(), Probe()
    gate = gate_of(Backend(concurrency=1, ready=probe, ready_every_s=0.5), clock)
    assert await call(gate) and probe.calls == 1
    # The one task the backend runs may have started since: that answer is spent.
    assert not await call(gate) and probe.calls == 1
    clock.now += 0.5
    assert await call(gate) and probe.calls == 2


async def test_a_busy_answer_is_a_fresh_not_ready_and_slows_an_auto_rate() -> None:
    clock, probe = Clock(), Probe()
    rate = AdaptiveRate(100.0, decrease=0.9, clock=clock)
    gate = BackendGate(
        "api",
        Backend(ready=probe, ready_every_s=1.0),
        limiter=rate,
        breaker=CircuitBreaker(5),
        clock=clock,
    )
    with pytest.raises(batchrun.Busy):
        async with gate.call(None):  # type: ignore[arg-type]
            raise batchrun.Busy("HTTP 503", backend="api")
    assert (gate.throttles, rate.rate) == (1, 90.0)
    assert not await call(gate) and probe.calls == 1  # not asked: it just said busy
    clock.now += 1.0
    assert await call(gate) and probe.calls == 2


# -- the rate law of backends ---------------------------------------------------------------


async def test_an_auto_backend_rate_settles_near_the_limit_it_finds() -> None:
    # One caller always waiting (backlogged) against a backend that throttles (429,
    # Retry-After: 1) above 200 calls in a second, on a fake clock: slow start finds the
    # limit, the gentle decrease keeps it near (halving would settle near 0.75 of it).
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.now += seconds

    rate = limiter("auto", None)
    assert rate is not None
    paced = AdaptiveRate(
        rate.rate, decrease=0.9, slow_start=True, floor=0.5, clock=clock, sleep=sleep
    )
    served: Counter[int] = Counter()
    start = clock.now
    while clock.now - start < 300:
        await paced.acquire()
        second = int(clock.now)
        if served[second] >= 200:
            paced.throttled(1.0)
        else:
            served[second] += 1
            paced.succeeded()
    steady = [served[s] for s in range(int(start) + 120, int(start) + 300)]
    mean = sum(steady) / len(steady)
    assert mean >= 0.85 * 200, mean
    assert 0.85 * 200 <= paced.settled <= 200 * 1.05, paced.settled


# -- a run waits for a busy backend; a stop ends the wait -----------------------------------


class Never(batchrun.Job):
    """Calls a backend that is never ready."""

    name = "never"
    period = "month"
    backends = {"api": Backend(ready=lambda ctx: False, ready_every_s=0.05)}

    async def page(self, ctx: batchrun.Context, after: int, limit: int) -> list[dict[str, Any]]:
        return [{"id": i} for i in range(after + 1, min(after + limit, 3) + 1)]

    async def process(self, ctx: batchrun.Context, row: dict[str, Any]) -> None:
        async with ctx.backend("api"):
            raise AssertionError("never ready: never called")


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[Store]:
    database = await connect(sqlite_url, create=True)
    migrated = Store(database)
    await migrated.migrate([])
    try:
        yield migrated
    finally:
        await database.close()


def runtime_of(store: Store, job: batchrun.Job, **env: str) -> Runtime:
    from batchrun.mail.base import from_url as mailer_from_url
    from batchrun.queue.base import from_url as queue_from_url

    settings = Settings.from_env({"BATCHRUN_LEASE_S": "2", **env}).with_overrides(
        db_url=store.db.url, mail_url="discard://"
    )
    queue = queue_from_url(None, db=store.db, max_receives=5)
    return Runtime(job, store, mailer_from_url("discard://"), queue, settings)


async def until(check: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


async def test_a_run_waits_for_a_busy_backend_until_it_is_stopped(store: Store) -> None:
    from batchrun.period import parse

    rt = runtime_of(store, Never())
    running = asyncio.create_task(rt.run(parse("month", "2025-06"), Options(concurrency=3)))
    pool = rt.effects.backends
    await until(lambda: "api" in pool.gates and pool.gates["api"].busy_waits >= 3)
    assert not running.done()  # busy is no failure: it waits
    rt.stop.request("test stops it")
    summary = await running
    assert (summary.succeeded, summary.failed, summary.left_pending) == (0, 0, 3)
    assert summary.to_json()["backends"]["api"]["busy_waits"] == 3
    rows = await store.jobdb.fetch("SELECT attempts, owner FROM batchrun_ledger")
    assert rows == [{"attempts": 0, "owner": None}] * 3  # released, no attempt counted


async def test_a_busy_backend_never_dead_letters_however_long_it_lasts(store: Store) -> None:
    from batchrun.period import parse

    def time_passes() -> Any:
        return store.jobdb.execute("UPDATE batchrun_queue SET visible_at = 0")

    job = Never()
    await runtime_of(store, job).submit(job, parse("month", "2025-06"), [1, 2, 3])
    for times in range(1, 9):  # more drains than the queue's 5 receives
        drained = await runtime_of(store, job, BATCHRUN_BUSY_WAIT_S="0").retry()
        assert (drained.busy, drained.processed, drained.dead_lettered) == (3, 0, 0)
        rows = await store.jobdb.fetch("SELECT body, receive_count, dead FROM batchrun_queue")
        assert len(rows) == 3 and not any(r["dead"] for r in rows)
        assert {r["receive_count"] for r in rows} == {0}  # back as new
        assert {json.loads(r["body"])["busy"] for r in rows} == {times}  # its delay grows
        await time_passes()
    attempts = await store.jobdb.fetch("SELECT attempts FROM batchrun_ledger")
    assert [r["attempts"] for r in attempts] == [0, 0, 0]


# -- a shared slot across processes --------------------------------------------------------


def _migrate(db_url: str, jobs: str) -> dict[str, str]:
    env = {"BATCHRUN_DB": db_url, "BATCHRUN_JOBS": jobs, "BATCHRUN_MAIL": "console://"}
    migrated = run_cli("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    return env


def _worker(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "batchrun", "worker", *args],
        env=full,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("server", ["mysql", "postgresql"])
def test_a_shared_cap_of_1_holds_across_three_workers(
    server: str, request: pytest.FixtureRequest
) -> None:
    db_url: str = request.getfixturevalue("mysql_url" if server == "mysql" else "postgres_url")
    env = {**_migrate(db_url, JOBS), "BATCHRUN_LEASE_S": "5"}
    query(db_url, EFFECT)
    with batchrun.connect(db=db_url, jobs=JOBS, env={}) as client:
        for uid in range(1, 31):
            client.submit("slotted", uid, data={"hold_s": 0.02})
    workers = [_worker(env, "--idle-exit", "3", "--concurrency", "8", "--json") for _ in range(3)]
    summaries = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-2000:]
        summaries.append(json.loads(out))
    rows = sorted(effects(db_url), key=lambda r: r[3])
    assert len(rows) == 30 and len({r[1] for r in rows}) == 30  # every task once
    overlaps = [(a[1], b[1]) for a, b in pairwise(rows) if b[3] < a[4]]
    assert overlaps == []  # one call at a time, across the three processes
    calls = [s["backends"]["slot"]["calls"] for s in summaries if "backends" in s]
    assert sum(calls) == 30
    print(
        f"\nshared slot, 3 workers: calls per worker {calls}, busy waits "
        f"{[s['backends']['slot']['busy_waits'] for s in summaries if 'backends' in s]}"
    )


def test_a_killed_holders_slot_is_taken_over_after_its_lease(mysql_url: str) -> None:
    env = {**_migrate(mysql_url, JOBS), "BATCHRUN_LEASE_S": "2"}
    query(mysql_url, EFFECT)
    with batchrun.connect(db=mysql_url, jobs=JOBS, env={}) as client:
        client.submit("slotted", 1, key="holder", data={"hold_s": 600})
        holder = _worker(env)
        slot = "SELECT owner FROM batchrun_backend_slot WHERE backend = 'slot'"
        wait_for(lambda: bool(query(mysql_url, slot)) and query(mysql_url, slot)[0][0] is not None)
        # A second worker starts its task and waits for the one slot the holder keeps.
        client.submit("slotted", 2, key="next", data={"hold_s": 0})
        waiter = _worker(env, "--idle-exit", "3", "--json")
        state = "SELECT state FROM batchrun_entity_task WHERE task_key = 'next'"
        wait_for(lambda: query(mysql_url, state) == [(1,)])
    assert holder.poll() is None and waiter.poll() is None
    killed_ns = time.time_ns()
    holder.send_signal(signal.SIGKILL)  # mid-call: its slot is never let go
    holder.communicate(timeout=30)
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err[-2000:]
    (row,) = effects(mysql_url)
    assert row[1] == "next" and row[3] >= killed_ns  # it had the slot once the lease ran out
    summary = json.loads(out)
    assert summary["succeeded"] == 1 and summary["backends"]["slot"]["calls"] == 1
    assert query(mysql_url, slot) == [(None,)]  # let go after its call


def wait_for(check: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


# -- seed 001: the busy backend behind workers and behind the Lambda -------------------------


@pytest.fixture
def busy_backend() -> Iterator[BusyBackend]:
    with BusyBackend(task_s=0.2) as served:
        yield served


def submit_poisson(
    submit: Callable[[int, str], None], n: int, mean_gap_s: float, seed: int = 22
) -> threading.Thread:
    """Submit ``n`` tasks (entity i, file i) from a thread, gaps drawn around ``mean_gap_s``:
    the backend, busy ``task_s`` per task, is busy about ``task_s / mean_gap_s`` of the time."""
    rng = random.Random(seed)

    def go() -> None:
        for i in range(1, n + 1):
            submit(i, f"s3://uploads/{i}.mp4")
            time.sleep(rng.expovariate(1 / mean_gap_s))

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def check_backend(backend: BusyBackend, db_url: str, n: int) -> None:
    """0 requests while busy, each task taken once, tasks never overlapping, all recorded."""
    assert backend.busy_requests == []
    keys = Counter(t.key for t in backend.tasks)
    assert len(keys) == n and set(keys.values()) == {1}
    runs = sorted(backend.tasks, key=lambda t: t.started)
    assert all(b.started >= a.ended for a, b in pairwise(runs))
    handed = query(db_url, "SELECT COUNT(*), COUNT(DISTINCT task_key) FROM file_handoff")
    assert handed == [(n, n)]
    done = query(db_url, "SELECT state, COUNT(*) FROM batchrun_entity_task GROUP BY state")
    assert done == [(2, n)]  # every task succeeded: none failed, none dead


def utilisation(backend: BusyBackend) -> float:
    runs = sorted(backend.tasks, key=lambda t: t.started)
    span = runs[-1].ended - runs[0].started
    return sum(t.ended - t.started for t in runs) / span


def test_the_busy_backend_behind_four_workers(busy_backend: BusyBackend, mysql_url: str) -> None:
    n = 40
    env = {
        **_migrate(mysql_url, FILES_JOB),
        "BATCHRUN_BACKEND_WORKER_URL": busy_backend.url,
        "BATCHRUN_LEASE_S": "5",
    }
    workers = [_worker(env, "--idle-exit", "6", "--json") for _ in range(4)]
    with batchrun.connect(db=mysql_url, jobs=FILES_JOB, env={}) as client:

        def submit(uid: int, url: str) -> None:
            client.submit("files", uid, data={"s3_url": url})

        submit_poisson(submit, n, mean_gap_s=0.3).join()
    summaries = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-2000:]
        summaries.append(json.loads(out))
    check_backend(busy_backend, mysql_url, n)
    dead = query(mysql_url, "SELECT COUNT(*) FROM batchrun_queue WHERE dead = 1")
    assert dead == [(0,)]
    figures = [s.get("backends", {}).get("worker", {}) for s in summaries]
    status = busy_backend.status_answers
    print(
        f"\nbusy backend, 4 workers: {n} tasks, utilisation {utilisation(busy_backend):.0%}, "
        f"status answers {dict(status)}, calls {[f.get('calls', 0) for f in figures]}, "
        f"busy waits {[f.get('busy_waits', 0) for f in figures]}, "
        f"given back {[s['busy'] for s in summaries]}"
    )


def event_source(
    sqs: Any,
    url: str,
    environ: dict[str, str],
    done: Callable[[], bool],
    *,
    pollers: int = 2,
    max_receives: int = 5,
) -> Counter[str]:
    """The SQS event source mapping: ``pollers`` concurrent pollers, each invoking the
    handler with up to 10 records and deleting what it does not report failed (a failed
    record comes back when its visibility timeout, which the handler set, ends). Returns
    the records delivered per task key."""
    from batchrun import aws_lambda

    delivered: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []
    receives: list[int] = []

    def poll() -> None:
        try:
            while not done():
                got = sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=0,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                ).get("Messages", [])
                if not got:
                    time.sleep(0.05)
                    continue
                with lock:
                    for m in got:
                        delivered[json.loads(m["Body"])["key"]] += 1
                        receives.append(int(m["Attributes"]["ApproximateReceiveCount"]))
                records = [
                    {
                        "messageId": m["MessageId"],
                        "receiptHandle": m["ReceiptHandle"],
                        "body": m["Body"],
                        "attributes": m.get("Attributes", {}),
                        "eventSource": "aws:sqs",
                    }
                    for m in got
                ]
                result = aws_lambda.handle(
                    {"Records": records}, FakeContext(30, "req"), environ=environ
                )
                failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
                for m in got:
                    if m["MessageId"] not in failed:
                        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(pollers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    assert max(receives) < max_receives, receives  # SQS's own count never reached it
    return delivered


def test_the_busy_backend_behind_the_sqs_triggered_lambda(
    busy_backend: BusyBackend, moto_server: MotoServer, mysql_url: str
) -> None:
    n = 30
    moto_server.reset()
    url, dlq = make_queue_with_dlq(moto_server, visibility_s=30, max_receives=5)
    environ = {
        **_migrate(mysql_url, FILES_JOB),
        **moto_server.env,
        "BATCHRUN_RETRY_QUEUE": url,
        "BATCHRUN_BACKEND_WORKER_URL": busy_backend.url,
        "BATCHRUN_LEASE_S": "5",
        "BATCHRUN_BUSY_WAIT_S": "10",  # waited in the invocation, then given back
    }
    sqs = aws_client(moto_server)
    with batchrun.connect(db=mysql_url, queue=url, jobs=FILES_JOB, env=moto_server.env) as client:

        def submit(uid: int, file: str) -> None:
            client.submit("files", uid, data={"s3_url": file})

        submitting = submit_poisson(submit, n, mean_gap_s=0.3)

        def done() -> bool:
            return (
                not submitting.is_alive() and len(busy_backend.tasks) == n and not _depth(sqs, url)
            )

        delivered = event_source(sqs, url, environ, done)
    check_backend(busy_backend, mysql_url, n)
    assert _depth(sqs, dlq) == 0  # nothing dead-lettered
    per_task = sum(delivered.values()) / n
    status = busy_backend.status_answers
    print(
        f"\nbusy backend, SQS-triggered Lambda: {n} tasks, utilisation "
        f"{utilisation(busy_backend):.0%}, status answers {dict(status)}, "
        f"SQS receives per task {per_task:.2f} (most {max(delivered.values())})"
    )
    assert status["busy"] > 0  # the backend was found busy
    assert per_task < 2


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_the_lambda_gives_tasks_back_while_the_backend_stays_busy(
    moto_server: MotoServer, mysql_url: str, fifo: bool
) -> None:
    # A client other than batchrun keeps the backend busy for a while; the Lambda may wait
    # 0.2 s in an invocation, so it gives each task back, again and again: a low redrive
    # limit would dead-letter a task hidden that often, never one given back. (FIFO hides
    # it, and a copy replaces it when one more receive could reach the limit: with 3, one
    # receive in two is that copy's, visible at once, since FIFO takes no delay.)
    n = 2
    moto_server.reset()
    max_receives = 3 if fifo else 2
    url, dlq = _queue(moto_server, fifo=fifo, max_receives=max_receives)
    with BusyBackend(task_s=2.0) as backend:
        environ = {
            **_migrate(mysql_url, FILES_JOB),
            **moto_server.env,
            "BATCHRUN_RETRY_QUEUE": url,
            "BATCHRUN_BACKEND_WORKER_URL": backend.url,
            "BATCHRUN_LEASE_S": "5",
            "BATCHRUN_BUSY_WAIT_S": "0.2",
        }
        assert backend.take("outside", {"s3_url": "s3://elsewhere"}) == 202  # busy for 2 s
        sqs = aws_client(moto_server)
        with batchrun.connect(
            db=mysql_url, queue=url, jobs=FILES_JOB, env=moto_server.env
        ) as client:
            for uid in range(1, n + 1):
                client.submit("files", uid, data={"s3_url": f"s3://uploads/{uid}.mp4"})

        def done() -> bool:
            return len(backend.tasks) == n + 1 and not _depth(sqs, url)

        delivered = event_source(sqs, url, environ, done, pollers=1, max_receives=max_receives)
        assert backend.busy_requests == []
        assert sorted(Counter(t.key for t in backend.tasks).values()) == [1] * (n + 1)
    assert _depth(sqs, dlq) == 0
    assert sum(delivered.values()) > n  # given back at least once
    print(
        f"\nLambda, backend busy elsewhere ({'FIFO' if fifo else 'standard'} queue): SQS "
        f"receives per task {sum(delivered.values()) / n:.1f}, none dead-lettered"
    )


def _queue(moto_server: MotoServer, *, fifo: bool, max_receives: int) -> tuple[str, str]:
    if not fifo:
        return make_queue_with_dlq(moto_server, max_receives=max_receives, visibility_s=30)
    sqs = aws_client(moto_server)
    attributes = {"FifoQueue": "true"}
    dlq = str(sqs.create_queue(QueueName="busy-dlq.fifo", Attributes=attributes)["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
    redrive = {"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": str(max_receives)}
    attributes.update(RedrivePolicy=json.dumps(redrive), VisibilityTimeout="30")
    return str(sqs.create_queue(QueueName="busy.fifo", Attributes=attributes)["QueueUrl"]), dlq


def _depth(sqs: Any, url: str) -> int:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(name, 0)) for name in names)


# -- SQS: a busy message given back ---------------------------------------------------------


async def test_sqs_gives_a_busy_message_back_as_a_delayed_copy_or_hides_it_on_fifo(
    moto_server: MotoServer,
) -> None:
    from batchrun.queue.sqs import SqsQueue

    moto_server.reset()
    sqs = aws_client(moto_server)
    standard, _ = make_queue_with_dlq(moto_server, "std", dlq_name="std-dlq", max_receives=3)
    fifo_dlq = sqs.create_queue(QueueName="f-dlq.fifo", Attributes={"FifoQueue": "true"})
    arn = sqs.get_queue_attributes(QueueUrl=fifo_dlq["QueueUrl"], AttributeNames=["QueueArn"])
    redrive = json.dumps(
        {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": "3"}
    )
    fifo = sqs.create_queue(
        QueueName="f.fifo", Attributes={"FifoQueue": "true", "RedrivePolicy": redrive}
    )["QueueUrl"]
    body = QueueMessage("entity_task", "files", "", entity_id=1, key="k").to_json()
    again = QueueMessage("entity_task", "files", "", entity_id=1, key="k", busy=1).to_json()
    for url, is_fifo in ((standard, False), (fifo, True)):
        queue = SqsQueue(url, env=moto_server.env, wait_s=0)
        try:
            await queue.send([body])
            (item,) = await queue.receive(max_messages=1, visibility_s=30)
            resent = await queue.give_back(item, again, 2.0)
            assert resent is not is_fifo  # a standard queue: a copy; FIFO: the message waits
            if resent:
                await queue.delete([item])
                assert await queue.receive(max_messages=10, visibility_s=30) == []  # delayed
            else:  # one more receive would reach the limit of 3: a copy replaces it
                near = Received(item.message_id, item.receipt, item.body, 2)
                assert not await queue.give_back(near, again, 0.0)
            (copy,) = await _receive_within(queue, 10.0)
            assert (copy.body, copy.receive_count) == (again, 1)
        finally:
            await queue.close()


async def _receive_within(queue: Any, seconds: float) -> list[Received]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = await queue.receive(max_messages=10, visibility_s=30)
        if got:
            return list(got)
        await asyncio.sleep(0.1)
    return []


def test_the_example_job_loads() -> None:
    assert Path(FILES_JOB).is_file()
    from batchrun.registry import discover

    job = discover([FILES_JOB], builtins=()).get_job("files")
    backend = job.backends["worker"]
    assert (backend.concurrency, backend.shared, backend.ready is not None) == (1, True, True)

"""Crash anywhere: kill ``birthday`` runs with SIGKILL at random moments, then rerun to
completion and check the month (one card and one email each, duplicates within the
bound). Used by ``tests/guarantees/test_faults.py`` and, longer, by ``test_soak.py``."""

from __future__ import annotations

import json
import random
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from batchrun.db.store import State
from support.birthday import eligible_ids, want_ids
from support.checks import assert_month_complete
from support.cli import cli_env, cli_seed_users, run_cli, spawn, summary_of, wait_until
from support.db import query
from support.smtp_server import SmtpTestServer

CONCURRENCY = 10
TEMPORARY = "451 4.3.0 Try again later"


def month_status(env: dict[str, str], month: str) -> dict[str, Any]:
    """``batchrun status --month MONTH --json``, parsed."""
    result = run_cli("status", "--month", month, "--json", env=env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@dataclass
class CrashReport:
    """What the kills of a crash-anywhere loop hit, for the report and the sanity checks."""

    seed: int
    iterations: int = 0
    eligible: int = 0
    kills: int = 0
    before_any_mail: int = 0
    mid_month: int = 0
    finished_first: int = 0
    retries_needed: int = 0
    lost_claims: int = 0
    duplicates: int = 0
    max_duplicates: int = 0
    duration_s: float = 0.0


def crash_anywhere(
    db_url: str,
    server: SmtpTestServer,
    *,
    seed: int,
    iterations: int,
    users: int = 3000,
    concurrency: int = CONCURRENCY,
    latency_s: float = 0.02,
    max_delay_s: float = 1.0,
    kills_per_iteration: tuple[int, int] = (1, 1),
    fail_rate: float = 0.0,
    first_year: int = 2030,
    extra_env: dict[str, str] | None = None,
) -> CrashReport:
    """Kill ``birthday`` runs with SIGKILL at random moments, then rerun to completion.

    Each iteration is its own year of the same month (cards are per year), so iterations
    never see each other's state. A kill lands either after a random delay from the
    process start (start-up, schema check, first page, claims, cards ...) or after a random
    number of emails reached the server (mid-month). With ``fail_rate`` a share of sends
    fail with a 4xx, so the rerun exits 3 and ``batchrun retry`` finishes the month.
    ``extra_env`` is added to every subprocess's environment (``BATCHRUN_LEASE_S``, a
    fault hook on ``PYTHONPATH``: see ``test_soak.py``).
    """
    rng = random.Random(seed)
    env = cli_env(db_url, server.url, **(extra_env or {}))
    cli_seed_users(db_url, env, users, seed)
    want = want_ids(db_url)
    eligible = eligible_ids(db_url, 6)
    report = CrashReport(seed=seed, eligible=len(eligible))
    started = time.monotonic()
    for i in range(iterations):
        year = first_year + i
        month = f"{year}-06"
        server.reset()
        server.set_latency(latency_s)
        if fail_rate:
            salt = rng.random()
            server.set_policy(
                lambda rcpt, n, salt=salt: (
                    TEMPORARY
                    if zlib.crc32(f"{salt}:{rcpt}:{n}".encode()) % 10_000 < fail_rate * 10_000
                    else None
                )
            )
        kills = rng.randint(*kills_per_iteration)
        plan: list[str] = []
        for _ in range(kills):
            before = len(server.messages)
            victim = spawn("birthday", "--month", month, "--concurrency", str(concurrency), env=env)
            exited = victim.poll
            if rng.random() < 0.5:
                delay = rng.uniform(0, max_delay_s)
                plan.append(f"after {delay:.3f}s")
                wait_until(lambda exited=exited: exited() is not None, timeout=delay)
            else:
                target = before + rng.randint(1, max(1, int(len(want) * 0.9)))
                plan.append(f"after {target - before} emails")
                wait_until(
                    lambda exited=exited, target=target: (
                        len(server.messages) >= target or exited() is not None
                    ),
                    timeout=60,
                )
            victim.kill()  # SIGKILL: no cleanup, claims and half-written work left behind
            _, err = victim.communicate(timeout=30)
            assert victim.returncode in (-9, 0, 3), f"seed={seed} i={i} {plan}: {err}"
            report.kills += 1
            sent = len(server.messages) - before
            if victim.returncode != -9:
                report.finished_first += 1
            elif sent == 0:
                report.before_any_mail += 1
            else:
                report.mid_month += 1
        where = f"seed={seed} iteration={i} month={month} kills: {', '.join(plan)}"
        rerun = run_cli("birthday", "--month", month, "--json", env=env, timeout=120)
        assert rerun.returncode in ((0, 3) if fail_rate else (0,)), f"{where}: {rerun.stderr}"
        report.lost_claims += int(summary_of(rerun).get("lost_claims", 0))
        if fail_rate:
            # Failures queued by a killed run are finished by the rerun; their messages
            # still wait, so a drain always follows (it deletes those, retries the rest).
            report.retries_needed += rerun.returncode == 3
            server.set_policy(None)
            retry = run_cli("retry", "--json", env=env, timeout=120)
            assert retry.returncode == 0, f"{where}: {retry.stderr}"
            assert summary_of(retry)["remaining"] == 0, where
            report.lost_claims += int(summary_of(retry).get("lost_claims", 0))
            where += f"; retry: {retry.stdout.strip()}"
        status = month_status(env, month)
        if (status["pending"], status["retrying"], status["retry_queue_depth"]) != (0, 0, 0):
            raise AssertionError(
                f"{where}: the month is not complete: {status}\n"
                f"rerun: {rerun.stdout.strip()} {rerun.stderr.strip()[-500:]}\n"
                f"{_unfinished(db_url, year, want)}"
            )
        duplicates = assert_month_complete(
            db_url,
            server,
            year=year,
            want=want,
            skipped=len(eligible - want),
            max_duplicates=concurrency * kills,
            where=where,
        )
        report.duplicates += duplicates
        report.max_duplicates = max(report.max_duplicates, duplicates)
        report.iterations += 1
    report.duration_s = round(time.monotonic() - started, 1)
    return report


def _unfinished(db_url: str, year: int, want: set[int]) -> str:
    """Where the users a month left unfinished stand, for a failure message."""
    rows = query(
        db_url,
        "SELECT entity_id, state, owner, lease_until, queued, attempts, last_error, updated_at "
        "FROM batchrun_ledger WHERE job = 'birthday' AND once_key = %s",
        str(year),
    )
    done = {int(r[0]) for r in rows if int(r[1]) in (int(State.SUCCEEDED), int(State.SKIPPED))}
    open_rows = sorted((r for r in rows if int(r[0]) not in done), key=lambda r: int(r[0]))
    missing = sorted(want - {int(r[0]) for r in rows})
    owners = Counter(str(r[2]) for r in open_rows)
    return (
        f"ledger rows not finished: {len(open_rows)} (by owner {dict(owners)}), "
        f"first: {open_rows[:3]}; eligible users without a ledger row: {len(missing)} "
        f"{missing[:10]}; now_ms={int(time.time() * 1000)}"
    )

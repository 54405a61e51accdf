"""`batchrun metrics`: the Prometheus names and values against the ledger and the queue,
and the textfile written atomically."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.birthday import seed_users
from support.db import query
from support.smtp_server import SmtpTestServer, fail_recipients
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.control import metrics
from batchrun.control.history import History
from batchrun.db import Store
from batchrun.period import parse

JUNE = parse("month", "2025-06")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_match_the_ledger(
    db_url: str, store: Store, make_job: Callable[..., Any], smtp_server: SmtpTestServer
) -> None:
    rt = await make_job(db_url, mail_url=smtp_server.url)
    await seed_users(rt.store, 300, seed=4)
    june = query(
        db_url,
        "SELECT id, email FROM user WHERE birth_month = 6 AND status = 10 "
        "AND email IS NOT NULL ORDER BY id",
    )
    smtp_server.set_policy(
        fail_recipients({june[0][1]: "550 5.1.1 No such user", june[1][1]: "451 4.3.0 Later"})
    )
    await rt.run(JUNE)
    snapshot = await metrics.collect(rt.store, rt.queue)
    got = samples(metrics.render(snapshot).decode())

    ledger = query(
        db_url, "SELECT period, state, COUNT(*) FROM batchrun_ledger GROUP BY period, state"
    )
    names = {0: "pending", 1: "sent", 2: "skipped", 3: "retrying", 4: "failed"}
    want = {
        (
            "batchrun_entities",
            (("job", "birthday"), ("period", str(p)), ("state", names[int(s)])),
        ): float(n)
        for p, s, n in ledger
    }
    entities = {k: v for k, v in got.items() if k[0] == "batchrun_entities"}
    assert entities == want
    assert (
        want[
            ("batchrun_entities", (("job", "birthday"), ("period", "2025-06"), ("state", "failed")))
        ]
        == 1.0
    )
    ((waiting, dead),) = query(
        db_url,
        "SELECT SUM(CASE WHEN dead = 0 THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN dead = 1 THEN 1 ELSE 0 END) FROM batchrun_queue",
    )
    assert got[("batchrun_queue_depth", (("queue", "retry"),))] == float(waiting) == 1.0
    assert got[("batchrun_queue_depth", (("queue", "dead"),))] == float(dead) == 1.0


def test_last_runs_render_as_timestamps() -> None:
    snapshot = metrics.Snapshot(
        last_runs=[
            metrics.LastRun("birthday", "ok", 1_750_000_000.0, 12.5),
            metrics.LastRun("birthday", "failed", 1_750_000_100.0, 3.0),
            metrics.LastRun("renewal", "retrying", 1_740_000_000.0, 1.0),
        ]
    )
    got = samples(metrics.render(snapshot).decode())
    key = "batchrun_last_run_timestamp_seconds"
    assert got[(key, (("job", "birthday"), ("outcome", "ok")))] == 1_750_000_000.0
    assert got[(key, (("job", "birthday"), ("outcome", "failed")))] == 1_750_000_100.0
    assert got[("batchrun_last_success_timestamp_seconds", (("job", "birthday"),))] == 1.75e9
    assert ("batchrun_last_success_timestamp_seconds", (("job", "renewal"),)) not in got
    # The duration is the latest finished run's, whatever its outcome.
    assert got[("batchrun_run_duration_seconds", (("job", "birthday"),))] == 3.0
    assert got[("batchrun_run_duration_seconds", (("job", "renewal"),))] == 1.0


def test_textfile_is_replaced_whole(sqlite_url: str, tmp_path: Path) -> None:
    env = {k: None for k in os.environ if k.startswith("BATCHRUN_")}
    env |= {"BATCHRUN_DB": sqlite_url, "BATCHRUN_MAIL": f"file://{tmp_path / 'outbox'}"}
    runner = CliRunner()
    for args in (
        ["db", "migrate"],
        ["db", "seed", "--users", "120"],
        ["birthday", "--month", "2025-06"],
    ):
        assert runner.invoke(app, args, env=env).exit_code == 0
    target = tmp_path / "prom" / "batchrun.prom"
    target.parent.mkdir()
    target.write_text("stale\n")
    inode = target.stat().st_ino
    result = runner.invoke(app, ["metrics", "--textfile", str(target)], env=env)
    assert result.exit_code == 0, result.output
    text = target.read_text()
    assert "stale" not in text and 'state="sent"' in text
    assert target.stat().st_ino != inode  # a rename, not a rewrite in place
    assert sorted(p.name for p in target.parent.iterdir()) == ["batchrun.prom"]  # no temp left
    printed = runner.invoke(app, ["metrics"], env=env)
    assert printed.exit_code == 0 and samples(printed.stdout) == samples(text)
    missing = runner.invoke(
        app, ["metrics", "--textfile", str(tmp_path / "no" / "x.prom")], env=env
    )
    assert missing.exit_code == 2 and "no folder" in missing.output


async def test_last_run_gauges_come_from_the_history(store: Store, db_url: str) -> None:
    history = History(store.db, lease_s=2.0)
    ok = await history.start(kind="run", job="birthday", period="2025-06")
    await history.end(ok, exit_code=0, outcome="ok", counts={})
    failed = await history.start(kind="run", job="birthday", period="2025-07")
    await history.end(failed, exit_code=1, outcome="failed", counts={}, error="boom")
    await history.start(kind="run", job="birthday", period="2025-08")  # still running
    # A run that found its job paused did nothing: no last success (an alert on its age
    # stayed quiet for as long as cron ran the paused job).
    held = await history.start(kind="run", job="birthday", period="2025-09")
    await history.end(held, exit_code=0, outcome="ok", counts={"eligible": 0, "paused": True})
    got = samples(
        metrics.render(
            await metrics.collect(store, None, last_runs=await metrics.last_runs(store))
        ).decode()
    )
    rows = {
        int(r[0]): (int(r[1]), int(r[2]))
        for r in query(
            db_url, "SELECT id, started_at, ended_at FROM batchrun_run WHERE ended_at IS NOT NULL"
        )
    }
    key = "batchrun_last_run_timestamp_seconds"
    assert got[(key, (("job", "birthday"), ("outcome", "ok")))] == rows[ok][1] / 1000
    assert got[(key, (("job", "birthday"), ("outcome", "failed")))] == rows[failed][1] / 1000
    assert not any(k[0] == key and ("outcome", "running") in k[1] for k in got)
    assert (
        got[("batchrun_last_success_timestamp_seconds", (("job", "birthday"),))]
        == rows[ok][1] / 1000
    )
    took = (rows[failed][1] - rows[failed][0]) / 1000
    assert got[("batchrun_run_duration_seconds", (("job", "birthday"),))] == took

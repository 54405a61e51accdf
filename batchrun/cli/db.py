"""``batchrun db``: the schema (batchrun's and every job's), demo users, the page's plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli import explain
from batchrun.cli.app import Invocation, db_app, period_option, run_command
from batchrun.cli.conventions import examples, print_pairs, say, stderr, stdout
from batchrun.db import ddl
from batchrun.db.sqlite import sqlite_path
from batchrun.errors import ConfigError, DatabaseError, UsageError
from batchrun.period import current
from batchrun.runtime.inspection import page_plans
from batchrun.runtime.resources import open_backends
from batchrun.urls import scheme_of


@db_app.command(
    "migrate",
    epilog=examples(
        "batchrun db migrate",
        "batchrun db migrate --plan",
        "batchrun db migrate --plan --json",
        "batchrun db migrate --allow-locking",
    ),
)
def db_migrate(
    ctx: typer.Context,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            metavar="",
            help="Print each step migrate would run, with its table, algorithm, lock and the "
            "table's row estimate; change nothing.",
        ),
    ] = False,
    allow_locking: Annotated[
        bool,
        typer.Option(
            "--allow-locking",
            metavar="",
            help="Run a step the server cannot do online (MySQL/MariaDB refuses its "
            "ALGORITHM=INSTANT or INPLACE, LOCK=NONE, e.g. on a MyISAM table) without those "
            "clauses: the server may then copy the table and block its writes meanwhile. "
            "Without it such a step stops the migration with one line.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="With --plan: the steps as one JSON list.")
    ] = False,
) -> None:
    """Create or upgrade the schema: batchrun's tables, then each job's own steps.

    Idempotent, and never drops application data.

    On MySQL/MariaDB every change to an existing table is made online (see --plan).
    """
    context: Invocation = ctx.obj
    if as_json and not plan:
        raise typer.BadParameter("--json goes with --plan", param_hint="--json")

    settings = context.settings
    missing = _missing_sqlite_file(settings.db_url) if plan else None
    if missing is not None:
        # Nothing to read yet: the plan is an empty database's, and the file stays missing.
        settings = settings.with_overrides(db_url="sqlite:///:memory:")

    async def go() -> int:
        jobs = [entry.job for entry in context.registry.values()]
        # --plan opens as every read-only command does: it creates no file, turns on no WAL.
        async with open_backends(settings, create=not plan, migrated=False) as backends:
            store = backends.store
            notes: list[str] = []
            if plan:
                steps = await store.plan(jobs)
                skipped = await store.foreign_jobs_notes(jobs)
            else:
                applied = await store.migrate(jobs, notes=notes, allow_locking=allow_locking)
        if plan:
            if as_json:
                print(json.dumps([s.to_json() for s in steps]))
            elif steps:
                for line in ddl.plan_lines(steps):
                    stdout.print(line, highlight=False, soft_wrap=True)
            else:
                stderr.print(f"{store.db.url} is up to date: nothing to do", highlight=False)
            for line in skipped:
                stderr.print(f"note: {line}", highlight=False, soft_wrap=True)
            if missing is not None:
                stderr.print(f"note: {missing} does not exist yet: migrate creates it")
            return 0
        for line in notes:
            stderr.print(f"note: {line}", highlight=False, soft_wrap=True)
        if applied:
            stderr.print(
                f"migrated {store.db.url}: {', '.join(applied)}", highlight=False, soft_wrap=True
            )
        else:
            stderr.print(f"{store.db.url} is up to date", highlight=False)
        return 0

    run_command(ctx, go)


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite database file that does not exist yet, if ``url`` names one."""
    if scheme_of(url) != "sqlite":
        return None
    try:
        path = sqlite_path(url)
    except ConfigError:
        return None  # open_backends says what is wrong with the URL
    return path if path != ":memory:" and not Path(path).exists() else None


@db_app.command(
    "seed",
    epilog=examples(
        "batchrun db seed --users 20000",
        "batchrun db seed --users 1000 --seed 7 --force",
        "batchrun --jobs ./greetings.py db seed --job greeting --users 100",
    ),
)
def db_seed(
    ctx: typer.Context,
    users: Annotated[int, typer.Option("--users", min=1, help="How many demo users to add.")],
    seed: Annotated[int, typer.Option("--seed", help="Random seed: same seed, same users.")] = 1,
    force: Annotated[
        bool,
        typer.Option("--force", metavar="", help="Add users even if the user table is not empty."),
    ] = False,
    job: Annotated[
        str, typer.Option("--job", metavar="JOB", help="The job whose demo data to add.")
    ] = "birthday",
) -> None:
    """Add deterministic demo data for JOB (its Job.seed): for birthday, demo users, a few
    inactive, a few without or with invalid addresses."""
    context: Invocation = ctx.obj

    async def go() -> int:
        entry = context.registry.entry(job)
        async with open_backends(context.settings) as backends:
            runtime = context.runtime(backends)
            period = current(entry.job.period)
            seeding, _ = runtime.effects.context(entry.job, period, stop=runtime.stop, dry_run=True)
            try:
                lines = await entry.job.seed(seeding, users, seed=seed, force=force)
            except NotImplementedError as exc:
                raise UsageError(str(exc)) from None
            except ValueError as exc:
                raise DatabaseError(str(exc)) from None
        say(f"{job} demo data in {backends.store.db.url}:")
        for line in lines:
            say(line)
        return 0

    run_command(ctx, go)


@db_app.command(
    "explain",
    epilog=examples(
        "batchrun db explain --month 2025-06",
        "batchrun db explain birthday --period 2025-06 --plan",
        "batchrun --jobs examples/renewal/renewal.py db explain renewal --period 2025-06-01 --json",
    ),
)
def db_explain(
    ctx: typer.Context,
    job: Annotated[str, typer.Argument(help="The job whose page query to explain.")] = "birthday",
    period: Annotated[
        str | None, typer.Option("--period", help="The job's period; default: now (UTC).")
    ] = None,
    month: Annotated[
        str | None, typer.Option("--month", help="YYYY-MM (a month job's --period).")
    ] = None,
    plan: Annotated[
        bool, typer.Option("--plan", metavar="", help="Also print the plan rows, labelled.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            metavar="",
            help='Print one JSON object: {"job", "period", "dialect", "verdict", "ok", '
            '"queries": [{"sql", "plan"}]}.',
        ),
    ] = False,
) -> None:
    """Check JOB's page query plan: one line saying which index it reads through and how
    many rows a page of 500 examines, or what is slow (a full scan, a sort) and what to do.

    For birthday: ok when it uses idx_user_birth_month_status_id, in id order. For any
    other job, the queries its page() runs through ctx.db are explained, not run.
    """
    context: Invocation = ctx.obj

    async def go() -> int:
        entry = context.registry.entry(job)
        which = period_option(
            entry.job.period, period or month, "--period" if period else "--month"
        )
        # Not jobs=[...]: a missing index is what explain is there to say.
        async with open_backends(context.settings) as backends:
            db = backends.store.jobdb
            runtime = context.runtime(backends)
            ctx, _ = runtime.effects.context(entry.job, which, stop=runtime.stop, dry_run=True)
            own = await entry.job.explain(ctx)
            if own is not None:
                plans, line = own
            else:
                plans = await page_plans(runtime.wiring, entry.job, which, explain.PAGE_SIZE)
                line = explain.page_verdict(job, db.dialect, plans, explain.PAGE_SIZE)
        if as_json:
            queries = [
                {"sql": sql, "plan": [{str(k): _plain(v) for k, v in r.items()} for r in rows]}
                for sql, rows in plans
            ]
            data = {
                "job": job,
                "period": str(which),
                "dialect": db.dialect,
                "verdict": line,
                "ok": explain.good(line),
                "queries": queries,
            }
            print(json.dumps(data))
            return 0
        stdout.print(line, highlight=False, markup=False)
        number = 0
        for _, rows in plans if plan else []:
            for row in rows:
                number += 1
                print_pairs(
                    f"plan row {number} ({db.dialect})",
                    {str(name): value for name, value in row.items()},
                )
        return 0

    run_command(ctx, go)


def _plain(value: object) -> object:
    return value if value is None or isinstance(value, int | float | str) else str(value)

"""``batchrun db``: the schema (batchrun's and every job's), demo users, the page's plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from batchrun.backends import open_backends
from batchrun.cli import explain
from batchrun.cli.app import Context, db_app, period_option, run_command
from batchrun.cli.conventions import stderr, stdout
from batchrun.db import ddl
from batchrun.db.sqlite import sqlite_path
from batchrun.errors import ConfigError, DatabaseError
from batchrun.jobs.birthday import demo
from batchrun.urls import scheme_of


@db_app.command("migrate")
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
    context: Context = ctx.obj
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


@db_app.command("seed")
def db_seed(
    ctx: typer.Context,
    users: Annotated[int, typer.Option("--users", min=1, help="How many demo users to add.")],
    seed: Annotated[int, typer.Option("--seed", help="Random seed: same seed, same users.")] = 1,
    force: Annotated[
        bool,
        typer.Option("--force", metavar="", help="Add users even if the user table is not empty."),
    ] = False,
) -> None:
    """Add deterministic demo users for the birthday job (a few inactive, a few without or
    with invalid addresses)."""
    context: Context = ctx.obj

    async def go() -> int:
        async with open_backends(context.settings) as backends:
            store = backends.store
            try:
                count = await demo.seed_users(store.jobdb, users, seed=seed, force=force)
            except demo.NotEmptyError as exc:
                raise DatabaseError(str(exc)) from None
        stderr.print(f"added {count} users to {store.db.url}", highlight=False)
        return 0

    run_command(ctx, go)


@db_app.command("explain")
def db_explain(
    ctx: typer.Context,
    month: Annotated[str | None, typer.Option("--month", help="YYYY-MM")] = None,
    plan: Annotated[
        bool, typer.Option("--plan", metavar="", help="Also print the plan rows, labelled.")
    ] = False,
) -> None:
    """Check the birthday page query's plan: one line saying which index it uses and how many
    rows a page of 500 examines (ok: idx_user_birth_month_status_id, in id order).
    """
    context: Context = ctx.obj
    which = period_option("month", month, "--month")

    async def go() -> int:
        async with open_backends(context.settings) as backends:
            db = backends.store.jobdb
            rows = await demo.explain(db, which)
        line = explain.verdict(db.dialect, rows)
        stdout.print(line, highlight=False, soft_wrap=True)
        for number, row in enumerate(rows if plan else [], 1):
            out = Table(title=f"plan row {number} ({db.dialect})", show_header=False)
            out.add_column("", style="bold")
            out.add_column("")
            for name, value in row.items():
                out.add_row(str(name), "" if value is None else str(value))
            stdout.print(out)
        return 0

    run_command(ctx, go)

"""The schema half of the store: batchrun's and each job's migration steps, their plan,
and what a job needs from the database; written once for every dialect.

Guards (``-- unless:`` lines), not a version number, decide which steps run, so a dropped
table is recreated and a second ``db migrate`` changes nothing. On an application's own
database a job whose tables are missing gets none created (its steps are the demo's, for
an empty database): migrate notes what it needs instead, and a job whose table has
another shape stops migrate before any step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from batchrun.db import ddl
from batchrun.db.base import Database, now_ms
from batchrun.db.sql import Statement, migration_steps
from batchrun.errors import DatabaseError, NotMigratedError, OutcomeUnknownError

if TYPE_CHECKING:
    from batchrun.job import Job

log = logging.getLogger(__name__)

NOTED_MISSING = "noted_missing_tables"  # batchrun_schema's record of a migrate note given


class Schema:
    """Migration steps, plans and requirements over a Database (``Store`` extends it)."""

    # Data steps SQL cannot do (IDNA, Unicode case folding): step name -> (the method that
    # does it, the table it rewrites). Such a step's SQL block holds only its guard and
    # comments; the method must be idempotent: the step is recorded after it returns.
    python_steps: ClassVar[Mapping[str, tuple[str, str]]] = {}

    def __init__(self, db: Database) -> None:
        self.db = db

    def _steps(self, jobs: Iterable[Job]) -> list[tuple[str, Statement]]:
        """(recorded name, step): batchrun's own first, then each job's, in order."""
        steps = [(step.name, step) for step in migration_steps(self.db.dialect)]
        for job in jobs:
            folder = job.migrations or job.sql
            if folder is not None:
                steps += [
                    (f"{job.name}.{step.name}", step)
                    for step in folder.migration_steps(self.db.dialect)
                ]
        return steps

    async def migrate(
        self,
        jobs: Iterable[Job] = (),
        *,
        notes: list[str] | None = None,
        allow_locking: bool = False,
    ) -> list[str]:
        """Run every step whose guard does not hold yet; return the names of the steps run.

        Guards, not the record in batchrun_schema, decide (but for data steps guarded
        ``recorded``): a dropped batchrun table is recreated, and a second run on a
        complete schema changes nothing at all. A job whose tables are missing from a
        database that holds other application tables gets none created (its steps are
        the demo's, for an empty database): ``notes`` gains one line naming what it needs.

        A step the server cannot run online (it refuses the ALGORITHM or LOCK the step
        states) stops the migration with one line naming it, unless ``allow_locking``:
        then it runs again without them, and the server may lock the table meanwhile.
        """
        applied: list[str] = []
        jobs = list(jobs)
        skipped = await self._foreign_database_jobs(jobs)
        for job in jobs:
            if job.name not in skipped and (missing := await self._missing_columns(job)):
                raise NotMigratedError(_needs(job, missing))  # before any step: nothing half made
        for name, step in self._steps(j for j in jobs if j.name not in skipped):
            if not await self._step_done(name, step):
                await self._run_step(name, step, allow_locking=allow_locking)
                applied.append(name)
                await self.db.execute("schema_record", step=name, now=now_ms())
        if notes is not None:
            await self._note_once(skipped, notes)
        return applied

    async def _note_once(self, skipped: dict[str, str], notes: list[str]) -> None:
        """Each job's missing-tables line, the first time migrate finds them missing; it is
        recorded in batchrun_schema, so later migrates only log it (``-v``). ``status`` and
        ``run`` still say it whenever they meet the job."""
        for job, line in skipped.items():
            marker = f"{job}.{NOTED_MISSING}"
            if await self.db.fetchone("schema_has_step", step=marker):
                log.info("%s", line)
                continue
            notes.append(line)
            await self.db.execute("schema_record", step=marker, now=now_ms())

    async def _run_step(self, name: str, step: Statement, *, allow_locking: bool) -> None:
        if name in self.python_steps:
            await getattr(self, self.python_steps[name][0])()
            return
        try:
            await self._run_sql_step(name, step, allow_locking=allow_locking)
        except OutcomeUnknownError as exc:
            # Its connection was lost (a KILL, a terminated backend, the network): a long
            # ALTER a DBA killed would otherwise start over at once, from scratch.
            raise DatabaseError(
                f"migration step {name} was cut off ({exc}); it is not run again in case "
                "someone stopped it on purpose: `batchrun db migrate` again finishes it"
            ) from exc

    async def _run_sql_step(self, name: str, step: Statement, *, allow_locking: bool) -> None:
        try:
            await self.db.run_step(step)
        except ddl.NotOnlineError as exc:
            plan = await self._plan_of(name, step)
            if not allow_locking:
                raise ddl.refused(plan, exc.reason) from None
            log.warning(
                "step %s on %s cannot run online (%s): running it without its "
                "ALGORITHM/LOCK clause (--allow-locking); %s may be locked for writes "
                "until it ends",
                name,
                plan.table,
                exc.reason,
                plan.table,
            )
            await self.db.run_step(ddl.without_online_clause(step))

    async def plan(self, jobs: Iterable[Job] = ()) -> list[ddl.StepPlan]:
        """The steps ``migrate`` would run, each with its table, algorithm, lock and the
        table's row estimate: reads only, nothing is created or changed."""
        jobs = list(jobs)
        skipped = await self._foreign_database_jobs(jobs)
        return [
            await self._plan_of(name, step)
            for name, step in self._steps(j for j in jobs if j.name not in skipped)
            if not await self._step_done(name, step)
        ]

    async def foreign_jobs_notes(self, jobs: Iterable[Job]) -> list[str]:
        """A line for each job whose tables this application database lacks (``migrate``
        creates none for it)."""
        return list((await self._foreign_database_jobs(list(jobs))).values())

    async def _plan_of(self, name: str, step: Statement) -> ddl.StepPlan:
        if name in self.python_steps:
            table = self.python_steps[name][1]
            rows = await self.db.estimate_rows(table)
            return ddl.StepPlan(name, "rewrite rows", table, None, None, rows)
        plan = ddl.describe(name, step)
        if plan.table is None:
            return plan
        return ddl.describe(name, step, await self.db.estimate_rows(plan.table))

    async def _foreign_database_jobs(self, jobs: list[Job]) -> dict[str, str]:
        """Jobs whose tables an application database lacks: name -> the line saying so."""
        tables = {str(r[0]) for r in await self.db.fetchall("list_tables")}
        found: dict[str, str] = {}
        for job in jobs:
            missing = [t for t in job.requires if t not in tables]
            others = tables - set(job.requires) - {t for t in tables if t.startswith("batchrun_")}
            if missing and others:
                found[job.name] = _needs(job, missing)
        return found

    async def missing_requirements(self, job: Job) -> str | None:
        """One line naming the tables and columns ``job`` needs that are not there, if any."""
        missing: list[str] = []
        for table, columns in job.requires.items():
            if not await self.db.has_table(table):
                missing.append(table)
                continue
            missing += [
                f"{table}.{column}"
                for column in columns
                if not await self.db.guard_holds(f"column {table}.{column}")
            ]
        return _needs(job, missing) if missing else None

    async def _missing_columns(self, job: Job) -> list[str]:
        """Columns ``job`` reads that a table of its, present, lacks (an application's own
        table of the same name and another shape): its steps would fail half-way."""
        missing: list[str] = []
        for table, columns in job.requires.items():
            if await self.db.has_table(table):
                missing += [
                    f"{table}.{column}"
                    for column in columns
                    if not await self.db.guard_holds(f"column {table}.{column}")
                ]
        return missing

    async def pending_steps(self, jobs: Iterable[Job] = ()) -> list[str]:
        """The names of the steps ``migrate`` would run."""
        jobs = list(jobs)
        skipped = await self._foreign_database_jobs(jobs)
        steps = self._steps(j for j in jobs if j.name not in skipped)
        return [name for name, step in steps if not await self._step_done(name, step)]

    async def check_migrated(self, jobs: Iterable[Job] = ()) -> None:
        """Raise NotMigratedError unless every schema step's guard holds."""
        jobs = list(jobs)
        for job in jobs:
            if foreign := await self._missing_columns(job):
                raise NotMigratedError(_needs(job, foreign))  # what migrate says too
        missing = await self.pending_steps(jobs)
        if missing:
            raise NotMigratedError(
                f"database {self.db.url} is missing part of batchrun's schema "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
                "run `batchrun db migrate`"
            )

    async def _step_done(self, name: str, step: Statement) -> bool:
        for guard in step.unless:
            if guard == "recorded":
                if await self.db.has_table("batchrun_schema") and await self.db.fetchone(
                    "schema_has_step", step=name
                ):
                    return True
            elif await self.db.guard_holds(guard):
                return True
        return False


def _needs(job: Job, missing: Sequence[str]) -> str:
    wanted = "; ".join(f"{t}({', '.join(c)})" for t, c in job.requires.items())
    return (
        f"job {job.name!r} needs {', '.join(missing)}, missing from this database "
        f"(it reads {wanted}): create them, or point --db at the database that has them"
    )

"""``batchrun new JOB``: write a job module, its templates and its test."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.app import app, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.scaffold import Scaffold


@app.command(
    "new",
    epilog=examples(
        "batchrun new renewal --dir jobs --table account",
        "pytest jobs/test_renewal.py",
        "batchrun --jobs jobs/renewal.py run renewal --dry-run",
    ),
)
def new(
    ctx: typer.Context,
    job: Annotated[
        str, typer.Argument(metavar="JOB", help="The job's name, also its module's: renewal.")
    ],
    folder: Annotated[
        Path, typer.Option("--dir", metavar="DIR", help="Where to write the files.")
    ] = Path(),
    table: Annotated[
        str,
        typer.Option(
            "--table",
            metavar="TABLE",
            help="The table whose rows (id, email columns) the job emails; user is the demo's.",
        ),
    ] = "user",
) -> None:
    """Write JOB.py, templates/JOB/ (subject.txt, body.txt, body.html extending the layout)
    and test_JOB.py, a test on batchrun.testing that passes as written.

    The job emails each row of TABLE once a month: edit its page query, its process and
    its templates from there. Nothing is overwritten: an existing file stops it (exit 2).

    JOB names the module too, so a Python keyword (import), a built-in job's name
    (birthday) or a module's, standard or installed (json, pytest), stops it (exit 2,
    nothing written).
    """

    async def go() -> int:
        written = Scaffold(job, table=table).write(folder)
        for path in written:
            stderr.print(f"wrote {path}", highlight=False, soft_wrap=True)
        module = folder / f"{job}.py"
        stderr.print(
            f"next: pytest {folder / f'test_{job}.py'}; "
            f"batchrun --jobs {module} run {job} --dry-run",
            highlight=False,
            soft_wrap=True,
        )
        return 0

    run_command(ctx, go)

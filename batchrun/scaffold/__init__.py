"""``batchrun new JOB``: a job module, its email templates and a test that passes as written.

The files are ``files/*.tmpl`` with ``$name``-style placeholders (``string.Template``: the
templates they write are Jinja2, whose braces must come out as they are).
"""

from __future__ import annotations

import re
import string
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from batchrun.errors import UsageError
from batchrun.period import Unit

# A job name that is also a module name, so the test can `import` it.
MODULE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_WORDS = {"day": "daily", "month": "monthly", "year": "yearly"}
_EXAMPLES = {"day": "2025-06-01", "month": "2025-06", "year": "2025"}


@dataclass(frozen=True)
class Scaffold:
    """What ``batchrun new`` writes: the job's name, its table and its period."""

    name: str
    table: str = "user"
    period: Unit = "month"

    def __post_init__(self) -> None:
        if not MODULE_NAME.fullmatch(self.name):
            raise UsageError(
                f"job name {self.name!r}: use lower-case letters, digits and underscores, "
                "starting with a letter, at most 32 (it is the module's name too)"
            )
        if self.name in sys.stdlib_module_names or self.name in ("batchrun", "test"):
            raise UsageError(f"job name {self.name!r} would shadow the module {self.name}")
        if not TABLE_NAME.fullmatch(self.table):
            raise UsageError(f"--table {self.table!r} is not a plain table name")

    @property
    def class_name(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_") if part) + "Job"

    def files(self) -> dict[str, str]:
        """Relative path -> content of every file to write."""
        values = {
            "name": self.name,
            "cls": self.class_name,
            "table": self.table,
            "period": self.period,
            "once": self.period,
            "period_word": _WORDS[self.period],
            "example": _EXAMPLES[self.period],
        }
        folder = resources.files("batchrun.scaffold").joinpath("files")

        def render(template: str) -> str:
            text = folder.joinpath(template).read_text(encoding="utf-8")
            return string.Template(text).substitute(values)

        templates = f"templates/{self.name}"
        return {
            f"{self.name}.py": render("job.py.tmpl"),
            f"{templates}/subject.txt": render("subject.txt.tmpl"),
            f"{templates}/body.txt": render("body.txt.tmpl"),
            f"{templates}/body.html": render("body.html.tmpl"),
            f"test_{self.name}.py": render("test_job.py.tmpl"),
        }

    def write(self, folder: Path) -> list[Path]:
        """Write the files under ``folder`` (made if missing); refuse to overwrite any.

        Raises:
            UsageError: one of the files exists already (nothing is written then).
        """
        files = {folder / relative: text for relative, text in self.files().items()}
        existing = [path for path in files if path.exists()]
        if existing:
            raise UsageError(
                f"{existing[0]} exists already: choose another --dir or name (nothing written)"
            )
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return list(files)


__all__ = ["Scaffold"]

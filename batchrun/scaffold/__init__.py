"""``batchrun new JOB``: a job module, its email templates and a test that passes as written.

The files are ``files/*.tmpl`` with ``$name``-style placeholders (``string.Template``: the
templates they write are Jinja2, whose braces must come out as they are).
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import string
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from batchrun.errors import UsageError
from batchrun.period import Unit
from batchrun.registry import BUILTINS

# A job name that is also a module name, so the test can `import` it: an identifier as it
# is (the file is NAME.py, the class CamelCase + "Job"); keywords are refused on their own.
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
        other = f"choose another name, such as {f'my_{self.name}'[:32]!r}"
        if keyword.iskeyword(self.name):
            # Soft keywords (match, case) are not refused: `from match import ...` parses.
            raise UsageError(
                f"job name {self.name!r} is a Python keyword, so its test's "
                f"`from {self.name} import ...` would not parse; {other}"
            )
        if self.name in BUILTINS:
            raise UsageError(
                f"job name {self.name!r} is taken by batchrun's built-in job: with both "
                f"loaded, `--jobs` would find two jobs named {self.name!r}; {other}"
            )
        if self.name in ("batchrun", "test") or _importable(self.name):
            raise UsageError(
                f"job name {self.name!r} would shadow the module {self.name} (the job's test "
                f"imports the job by its name and would get that module); {other}"
            )
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


def _importable(name: str) -> bool:
    """Whether ``import name`` finds a module other than the job's: the standard library's
    or an installed one. Pytest, jinja2 and the like are imported before the test imports
    the job, so ``from NAME import ...`` gets them; any other the job would shadow."""
    if name in sys.stdlib_module_names or name in sys.modules:
        return True
    spec = importlib.util.find_spec(name)  # a top-level name: finds, imports nothing
    if spec is None or spec.origin is None:
        # No module, or a namespace package (a bare folder), which NAME.py wins over.
        return False
    # `python -m batchrun` puts the working directory first on sys.path: a module there is
    # the user's own, which `batchrun` (the script) would not see; refuse it in neither.
    entry = Path(spec.origin).parent
    if spec.submodule_search_locations is not None:  # a package: origin is its __init__.py
        entry = entry.parent
    return entry != Path.cwd()


__all__ = ["Scaffold"]

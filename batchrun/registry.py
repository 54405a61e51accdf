"""Finds jobs: the built-ins, ``--jobs`` modules and ``.py`` files, the ``batchrun.jobs`` group.

A spec is a module name (``myapp.jobs``) or a path (``./renewal.py``): anything ending in
``.py`` or holding a path separator is a path. A file is loaded under a stable name,
``batchrun_job_<stem>_<hash of its resolved path>``, put in ``sys.modules`` before it runs
(so dataclasses and pickle find it); loading it again returns the same module. While it
runs, its folder is first on ``sys.path`` so it can import sibling helpers at top level;
the folder is taken off again afterwards, so it never shadows modules imported later.

A module's jobs are the ``batchrun.Job`` subclasses it defines (for a package, also those
its submodules define and it re-exports), less those whose ``name`` is empty: a class
without a name is a base class for other jobs. A class imported from elsewhere is not the
module's job. The same class reached twice (a spec and an entry point) registers once.

Every problem is a ``UsageError`` (exit 2) of one line naming the module or file and class.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points as _entry_points  # patched by tests
from pathlib import Path
from types import ModuleType
from typing import Any

from batchrun.backend import check_backends
from batchrun.errors import UsageError
from batchrun.job import NAME, Job
from batchrun.mail.message import sender_problem
from batchrun.period import UNITS
from batchrun.pipeline.reports import SUMMARY_KEYS, counter_names
from batchrun.task import is_task

log = logging.getLogger(__name__)

BUILTINS: dict[str, str] = {"birthday": "batchrun.jobs.birthday"}  # job name -> module
BUILTIN_MODULES: tuple[str, ...] = tuple(BUILTINS.values())
# What a scheduled Lambda event runs when BATCHRUN_SCHEDULED_JOBS is unset.
SCHEDULED_BY_DEFAULT: tuple[str, ...] = ("birthday",)
ENTRY_POINT_GROUP = "batchrun.jobs"


def builtin_modules(names: str | None) -> tuple[str, ...]:
    """The modules of the built-in jobs ``BATCHRUN_BUILTIN_JOBS`` names (comma-separated
    job names; empty: none; None, the variable unset: all of them).

    Raises:
        UsageError: a name that is no built-in job.
    """
    if names is None:
        return BUILTIN_MODULES
    modules = []
    for name in parse_specs(names):
        if name not in BUILTINS:
            raise UsageError(
                f"BATCHRUN_BUILTIN_JOBS: {name!r} is not a built-in job "
                f"(built-in: {', '.join(BUILTINS)}; empty for none)"
            )
        modules.append(BUILTINS[name])
    return tuple(modules)


@dataclass(frozen=True)
class JobEntry:
    """One registered job: its instance, where it came from and where its templates are."""

    job: Job
    cls: type[Job]
    source: str  # "built-in", the module name, the file's path, or "entry point <name>"
    module_file: Path | None
    templates_dir: Path | None


class Registry(Mapping[str, JobEntry]):
    """Job name -> entry, in registration order."""

    def __init__(self, entries: Sequence[JobEntry] = ()) -> None:
        self._entries = {entry.job.name: entry for entry in entries}

    def __getitem__(self, name: str) -> JobEntry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> JobEntry:
        """The entry of job ``name``; a ``UsageError`` listing the known jobs if none."""
        if name not in self._entries:
            close = difflib.get_close_matches(name, list(self._entries), n=1, cutoff=0.6)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            known = f"known jobs are {', '.join(self._entries)}" if self._entries else "no jobs"
            raise UsageError(
                f"unknown job {name!r}{guess}: {known}; a job of your own is loaded with "
                "--jobs MODULE_OR_FILE.py (or BATCHRUN_JOBS)"
            )
        return self._entries[name]

    def get_job(self, name: str) -> Job:
        """The job ``name``; a ``UsageError`` listing the known jobs if none."""
        return self.entry(name).job

    def describe(self) -> list[dict[str, str]]:
        """What ``batchrun jobs --json`` prints: one dict per job; ``kind`` is ``task`` for
        a task job (``batchrun.Task``: its period and once_per are unused), else
        ``period``."""
        return [
            {
                "name": entry.job.name,
                "kind": "task" if is_task(entry.job) else "period",
                "period": entry.cls.period,
                "once_per": entry.cls.once_unit(),
                "description": entry.cls.description,
                "source": entry.source,
            }
            for entry in self._entries.values()
        ]


def parse_specs(text: str | None) -> list[str]:
    """The specs of a ``--jobs`` / ``BATCHRUN_JOBS`` value: comma-separated, blanks dropped."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def discover(
    specs: Sequence[str] = (),
    *,
    builtins: Sequence[str] = BUILTIN_MODULES,
    entry_points: bool = True,
) -> Registry:
    """Load and check every job: ``builtins``, then ``specs``, then the entry-point group.

    Args:
        specs: module names or ``.py`` paths, as ``parse_specs`` returns them.
        builtins: modules of batchrun's own jobs (source ``"built-in"``).
        entry_points: whether to load the ``batchrun.jobs`` entry-point group, each value
            a module or ``module:Class``.

    Raises:
        UsageError: a module that fails to import, a class that breaks the ``Job``
            contract, or two jobs with one name; one line naming it.
    """
    found: list[tuple[type[Job], str, str]] = []  # (class, source, label for errors)
    for name in builtins:
        found += _from(_import(name, f"built-in {name}"), "built-in", f"built-in {name}")
    for spec in specs:
        if spec.endswith(".py") or "/" in spec or os.sep in spec or spec.startswith("."):
            path = Path(spec).expanduser().resolve()
            found += _from(_load_file(path, f"--jobs {spec}"), str(path), f"--jobs {spec}")
        else:
            found += _from(_import(spec, f"--jobs {spec}"), spec, f"--jobs {spec}")
    for point in _entry_points(group=ENTRY_POINT_GROUP) if entry_points else ():
        label = f"entry point {point.name} ({point.value})"
        module = _import(point.module, label)
        found += _from(module, f"entry point {point.name}", label, point.attr)

    entries: dict[str, JobEntry] = {}
    for cls, source, label in found:
        where = f"{label}: class {cls.__qualname__}"
        _check(cls, where)
        first = entries.get(cls.name)
        if first is not None and first.cls is cls:
            continue  # one class reached twice (a spec and an entry point) is one job
        if first is not None:
            raise UsageError(
                f"two jobs named {cls.name!r}: {first.cls.__qualname__} ({first.source}) "
                f"and {cls.__qualname__} ({source})"
            )
        entries[cls.name] = _entry(cls, source, where)
    return Registry(list(entries.values()))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _import_error(label: str, exc: BaseException) -> UsageError:
    if isinstance(exc, SystemExit):
        # A module that exits on import would end the command silently with its code
        # (exit 0 for sys.exit(0), as if all were done): an error naming it instead.
        return UsageError(f"{label}: cannot import: it called sys.exit({exc.code!r})")
    message = _one_line(f"{type(exc).__name__}: {exc}").removesuffix(":")
    return UsageError(f"{label}: cannot import: {message}")


def _import(name: str, label: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as exc:  # what a module raises on import is the user's
        raise _import_error(label, exc) from exc


def _load_file(path: Path, label: str) -> ModuleType:
    if not path.exists():
        raise UsageError(f"{label}: no such file")
    if not path.is_file() or path.suffix != ".py":
        raise UsageError(f"{label}: not a .py file")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"batchrun_job_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{label}: not a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[name]  # a failed load must not look loaded the next time
        raise _import_error(label, exc) from exc
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def _owns(module: ModuleType, cls: type[Job]) -> bool:
    if cls.__module__ == module.__name__:
        return True
    return hasattr(module, "__path__") and cls.__module__.startswith(module.__name__ + ".")


def _from(
    module: ModuleType, source: str, label: str, attr: str | None = None
) -> list[tuple[type[Job], str, str]]:
    """The jobs of ``module`` (only its class ``attr`` if given), with source and label."""
    if attr:
        value: Any = getattr(module, attr, None)
        if not (isinstance(value, type) and issubclass(value, Job) and value.name):
            raise UsageError(f"{label}: {attr} is not a batchrun.Job subclass with a name")
        return [(value, source, label)]
    classes = {  # a dict: a class bound to two names counts once
        value: None
        for value in list(vars(module).values())
        if isinstance(value, type)
        and issubclass(value, Job)
        and value.name  # a class with no name is a base for other jobs
        and _owns(module, value)
    }
    if not classes:
        raise UsageError(f"{label}: defines no batchrun.Job subclass with a name")
    return [(cls, source, label) for cls in classes]


def check_job(cls: type[Job]) -> None:
    """Raise a ``UsageError`` of one line when ``cls`` breaks the ``Job`` contract, as
    ``--jobs`` would (a bad name or period, a ``page`` that is not ``async def`` ...)."""
    _check(cls, f"class {cls.__qualname__}")


def _counters_problem(counters: object) -> str | None:
    """What makes a job's ``counters`` unusable, if anything: not names at all. A lone
    string is one name and a name the run's summary has is reported as ``job_NAME``
    (``_counters_notes``): both worked before, so they are warned about, not refused."""
    if isinstance(counters, str):
        return None
    if not isinstance(counters, tuple | list):
        return f"counters {counters!r} is not a tuple of names, e.g. ('cards_created',)"
    for name in counters:
        if not isinstance(name, str) or not name:
            return f"counters: {name!r} is not a name"
    return None


def _counters_notes(counters: object) -> list[str]:
    notes = []
    if isinstance(counters, str):
        notes.append(f"counters {counters!r} is a string: read as ({counters!r},)")
    for name in counter_names(counters):
        if name in SUMMARY_KEYS:
            notes.append(
                f"counters: {name!r} is a key of the run's summary: reported as 'job_{name}'"
            )
    return notes


def _check(cls: type[Job], where: str) -> None:
    def fail(problem: str) -> UsageError:
        return UsageError(_one_line(f"{where}: {problem}"))

    if not isinstance(cls.name, str) or not NAME.fullmatch(cls.name):
        raise fail(f"name {cls.name!r} does not match {NAME.pattern}")
    if cls.period not in UNITS:
        raise fail(f"period {cls.period!r} is not one of year, month, day")
    if cls.once_per is not None and cls.once_per not in UNITS:
        raise fail(f"once_per {cls.once_per!r} is not one of year, month, day")
    if UNITS.index(cls.once_unit()) < UNITS.index(cls.period):
        raise fail(f"once_per {cls.once_per!r} is shorter than period {cls.period!r}")
    if not isinstance(cls.description, str):
        raise fail("description is not a string")
    if cls.address is not None and (not isinstance(cls.address, str) or not cls.address):
        raise fail(f"address {cls.address!r} is not a column name (None: it sends no email)")
    if cls.sender is not None:
        if not isinstance(cls.sender, str):
            raise fail(f"sender {cls.sender!r} is not a string")
        if (problem := sender_problem(cls.sender)) is not None:
            raise fail(f"sender {cls.sender!r} {problem}")
    if (problem := check_backends(cls.backends)) is not None:
        raise fail(problem)
    if (problem := _counters_problem(cls.counters)) is not None:
        raise fail(problem)
    serial = getattr(cls, "serial", "entity")  # a task job's (batchrun.Task)
    if serial not in ("entity", "none"):  # "Entity" ran an entity's tasks all at once
        raise fail(f"serial {serial!r} is not one of entity, none")
    for method in ("page", "process"):
        if getattr(cls, method) is getattr(Job, method):
            raise fail(f"does not define {method}()")
    for method in ("page", "prepare", "process"):
        if not inspect.iscoroutinefunction(getattr(cls, method)):
            raise fail(f"{method}() is not an async def")
    for note in _counters_notes(cls.counters):
        log.warning("%s: %s", where, note)
    for name, meant in misspelled(cls):
        log.warning("%s: %r is nothing batchrun reads: did you mean %r?", where, name, meant)


def misspelled(cls: type[Job]) -> Iterator[tuple[str, str]]:
    """The class's own settings that look like a misspelled one of batchrun's (``peroid``),
    which is then left at its default (a monthly job, say): each with the setting it is
    close to. Settings only (the class variables batchrun's bases declare), against the
    job's own values, not its methods. A warning, not an error: a constant of the job's
    may look alike."""
    known = sorted(
        {
            n
            for base in cls.__mro__
            if base.__module__.startswith("batchrun.")
            for n in getattr(base, "__annotations__", {})
        }
    )
    for name, value in vars(cls).items():
        if name.startswith("_") or name in known or callable(value) or _is_method(value):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close and close[0] not in vars(cls):
            yield name, close[0]


def _is_method(value: object) -> bool:
    return isinstance(value, classmethod | staticmethod | property)


def _entry(cls: type[Job], source: str, where: str) -> JobEntry:
    try:
        job = cls()
    except (Exception, SystemExit) as exc:
        raise UsageError(_one_line(f"{where}: cannot create: {type(exc).__name__}: {exc}")) from exc
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    module_file = Path(file).resolve() if file else None
    folder = module_file.parent if module_file else None
    templates: Path | None = None
    if cls.templates is not None:
        templates = Path(cls.templates).expanduser()
        if not templates.is_absolute():
            templates = (folder or Path.cwd()) / templates
        if not templates.is_dir():
            raise UsageError(_one_line(f"{where}: templates folder {templates} does not exist"))
    elif folder is not None and (folder / "templates").is_dir():
        templates = folder / "templates"
    return JobEntry(job, cls, source, module_file, templates)

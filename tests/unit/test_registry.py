"""The registry: jobs from files, modules and entry points, and every way one is refused."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import batchrun
from batchrun import registry
from batchrun.errors import UsageError
from batchrun.period import parse
from batchrun.pipeline.reports import Summary
from batchrun.pipeline.run import new_summary
from batchrun.registry import discover, parse_specs

RENEWAL = """
    import batchrun

    class RenewalReminder(batchrun.Job):
        name = "renewal"
        period = "day"
        description = "Remind accounts a week before their plan renews"

        async def page(self, ctx, after, limit):
            return []

        async def process(self, ctx, row):
            pass
"""

CREDITS = """
    import batchrun

    class Base(batchrun.Job):  # no name: a base class, not a job
        period = "month"

        async def page(self, ctx, after, limit):
            return []

    class MonthlyCredits(Base):
        name = "credits"
        once_per = "year"

        async def prepare(self, ctx, rows):
            pass

        async def process(self, ctx, row):
            pass
"""


def job_source(*, name: str = "thing", attrs: str = "", body: str | None = None) -> str:
    """A module with one job class ``Thing``; ``attrs`` and ``body`` replace its parts."""
    if body is None:
        body = """
            async def page(self, ctx, after, limit):
                return []

            async def process(self, ctx, row):
                pass
        """
    return (
        "import batchrun\n\n"
        "class Thing(batchrun.Job):\n"
        f"    name = {name!r}\n"
        + textwrap.indent(textwrap.dedent(attrs), "    ")
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def write(relative: str, source: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture(autouse=True)
def no_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed plugin leaks into these tests; a test sets its own entry points."""
    monkeypatch.setattr(registry, "_entry_points", lambda group: [])


def refused(*specs: str, **kwargs: Any) -> str:
    """The one-line message ``discover`` refuses ``specs`` with."""
    kwargs.setdefault("builtins", ())
    with pytest.raises(UsageError) as info:
        discover(specs, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_parse_specs() -> None:
    assert parse_specs(None) == []
    assert parse_specs("") == []
    assert parse_specs(" myapp.jobs, ./renewal.py,,/abs/credits.py ") == [
        "myapp.jobs",
        "./renewal.py",
        "/abs/credits.py",
    ]


def test_files_are_loaded_in_order_with_their_attributes(write: Callable[..., Path]) -> None:
    renewal = write("renewal.py", RENEWAL)
    credits = write("sub/credits.py", CREDITS)

    found = discover([str(renewal), str(credits)], builtins=())

    assert list(found) == ["renewal", "credits"]  # Base has no name: not a job
    entry = found["renewal"]
    assert isinstance(entry.job, entry.cls)
    assert isinstance(entry.job, batchrun.Job)
    assert entry.cls.__name__ == "RenewalReminder"
    assert entry.source == str(renewal.resolve())
    assert entry.module_file == renewal.resolve()
    assert entry.templates_dir is None
    assert found.get_job("credits") is found["credits"].job
    assert found.describe() == [
        {
            "name": "renewal",
            "kind": "period",
            "period": "day",
            "once_per": "day",
            "description": "Remind accounts a week before their plan renews",
            "source": str(renewal.resolve()),
        },
        {
            "name": "credits",
            "kind": "period",
            "period": "month",
            "once_per": "year",
            "description": "",
            "source": str(credits.resolve()),
        },
    ]


def test_a_relative_path_is_a_path(
    write: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write("jobs/renewal.py", RENEWAL)
    monkeypatch.chdir(tmp_path)
    found = discover(["jobs/renewal.py"], builtins=())
    assert found["renewal"].source == str(tmp_path.resolve() / "jobs" / "renewal.py")


def test_a_file_loads_once_under_a_stable_name(write: Callable[..., Path]) -> None:
    # a dataclass and pickle need the module in sys.modules under its name
    path = write(
        "renewal.py",
        RENEWAL
        + """
    import dataclasses, pickle

    @dataclasses.dataclass
    class Row:
        id: int

    ROUND_TRIP = pickle.loads(pickle.dumps(Row(7)))
    """,
    )
    first = discover([str(path)], builtins=())["renewal"]
    again = discover([str(path), str(path)], builtins=())["renewal"]

    assert again.cls is first.cls
    name = first.cls.__module__
    assert name.startswith("batchrun_job_renewal_")
    assert sys.modules[name].__file__ == str(path.resolve())
    assert sys.modules[name].ROUND_TRIP.id == 7
    assert str(path.parent.resolve()) not in sys.path  # only on sys.path while the file runs


def test_a_file_imports_its_sibling_helpers(write: Callable[..., Path]) -> None:
    write("helpers_for_renewal.py", "SUBJECT = 'Your plan renews'\n")
    path = write(
        "renewal.py",
        job_source(name="renewal", attrs="from helpers_for_renewal import SUBJECT\n"),
    )
    found = discover([str(path)], builtins=())
    assert found["renewal"].cls.SUBJECT == "Your plan renews"  # type: ignore[attr-defined]


def test_a_module_by_name_and_a_package_re_export(
    write: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write("regjobs_mod.py", RENEWAL)
    write("regjobs_pkg/__init__.py", "from regjobs_pkg.job import MonthlyCredits\n")
    write("regjobs_pkg/job.py", CREDITS)
    (tmp_path / "regjobs_pkg" / "templates").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))

    found = discover(["regjobs_mod", "regjobs_pkg"], builtins=())

    assert found["renewal"].source == "regjobs_mod"
    assert found["renewal"].cls.__module__ == "regjobs_mod"
    assert found["credits"].source == "regjobs_pkg"
    assert found["credits"].module_file == (tmp_path / "regjobs_pkg" / "job.py").resolve()
    assert found["credits"].templates_dir == (tmp_path / "regjobs_pkg" / "templates").resolve()


def test_builtins_come_first_with_their_own_source(
    write: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write("regjobs_builtin.py", CREDITS)
    renewal = write("renewal.py", RENEWAL)
    monkeypatch.syspath_prepend(str(tmp_path))

    found = discover([str(renewal)], builtins=["regjobs_builtin"])

    assert list(found) == ["credits", "renewal"]
    assert found["credits"].source == "built-in"
    assert refused(builtins=["regjobs_absent"]) == (
        "built-in regjobs_absent: cannot import: ModuleNotFoundError: "
        "No module named 'regjobs_absent'"
    )


def test_entry_points_a_module_and_a_class(
    write: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write("regjobs_ep_a.py", RENEWAL)
    write(
        "regjobs_ep_b.py", CREDITS + "\n    class Other(MonthlyCredits):\n        name = 'other'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [
        EntryPoint("renewals", "regjobs_ep_a", "batchrun.jobs"),
        EntryPoint("other", "regjobs_ep_b:Other", "batchrun.jobs"),
    ]
    groups: list[str] = []

    def fake(group: str) -> list[EntryPoint]:
        groups.append(group)
        return points

    monkeypatch.setattr(registry, "_entry_points", fake)

    found = discover(["regjobs_ep_a"], builtins=())  # also a spec: registered once

    assert groups == ["batchrun.jobs"]
    assert list(found) == ["renewal", "other"]  # only the class the entry point names
    assert found["renewal"].source == "regjobs_ep_a"
    assert found["other"].source == "entry point other"
    assert discover(builtins=(), entry_points=False) == {}
    assert len(groups) == 1

    points[:] = [EntryPoint("broken", "regjobs_ep_b:Nope", "batchrun.jobs")]
    assert refused() == (
        "entry point broken (regjobs_ep_b:Nope): Nope is not a batchrun.Job subclass with a name"
    )


def test_templates_dir(write: Callable[..., Path], tmp_path: Path) -> None:
    beside = write("beside/renewal.py", RENEWAL)
    (tmp_path / "beside" / "templates" / "renewal").mkdir(parents=True)
    named = write("named/job.py", job_source(name="named", attrs="templates = 'mail'\n"))
    (tmp_path / "named" / "mail").mkdir()
    (tmp_path / "named" / "templates").mkdir()  # the job's own setting wins
    absolute = tmp_path / "elsewhere"
    absolute.mkdir()
    pinned = write(
        "pinned/job.py", job_source(name="pinned", attrs=f"templates = {str(absolute)!r}\n")
    )

    found = discover([str(beside), str(named), str(pinned)], builtins=())

    assert found["renewal"].templates_dir == (tmp_path / "beside" / "templates").resolve()
    assert found["named"].templates_dir == (tmp_path / "named" / "mail").resolve()
    assert found["pinned"].templates_dir == absolute

    missing = write("missing/job.py", job_source(name="missing", attrs="templates = 'nope'\n"))
    message = refused(str(missing))
    assert message.startswith(f"--jobs {missing}: class Thing: templates folder ")
    assert message.endswith("nope does not exist")


def test_unknown_job(write: Callable[..., Path]) -> None:
    found = discover([str(write("renewal.py", RENEWAL)), str(write("c.py", CREDITS))], builtins=())
    hint = r"; a job of your own is loaded with --jobs MODULE_OR_FILE\.py \(or BATCHRUN_JOBS\)$"
    with pytest.raises(
        UsageError, match=rf"^unknown job 'x': known jobs are renewal, credits{hint}"
    ):
        found.get_job("x")
    with pytest.raises(UsageError, match=rf"^unknown job 'x': no jobs{hint}"):
        discover(builtins=()).get_job("x")
    with pytest.raises(UsageError, match=r"^unknown job 'renewl' \(did you mean 'renewal'\?\)"):
        found.get_job("renewl")


def test_import_errors(write: Callable[..., Path], tmp_path: Path) -> None:
    broken = write("renewal.py", "import regjobs_no_such_module\n")
    assert refused(str(broken)) == (
        f"--jobs {broken}: cannot import: ModuleNotFoundError: "
        "No module named 'regjobs_no_such_module'"
    )
    syntax = write("syntax.py", "def oops(:\n    pass\n")
    message = refused(str(syntax))
    assert message.startswith(f"--jobs {syntax}: cannot import: SyntaxError: ")
    assert "syntax.py, line 1" in message
    raising = write("raising.py", "raise RuntimeError('first line\\nsecond line')\n")
    assert refused(str(raising)) == (
        f"--jobs {raising}: cannot import: RuntimeError: first line second line"
    )
    assert refused("regjobs_no_such_module") == (
        "--jobs regjobs_no_such_module: cannot import: ModuleNotFoundError: "
        "No module named 'regjobs_no_such_module'"
    )
    assert refused(str(tmp_path / "absent.py")) == f"--jobs {tmp_path / 'absent.py'}: no such file"
    assert refused("./absent.py") == "--jobs ./absent.py: no such file"
    text = write("notes.txt", "hello")
    assert refused(str(text)) == f"--jobs {text}: not a .py file"
    # A folder given as "." or "..": a relative import's TypeError before
    for folder in (".", ".."):
        assert refused(folder) == f"--jobs {folder}: not a .py file"


def test_a_failed_file_is_retried_not_cached(write: Callable[..., Path]) -> None:
    path = write("flaky.py", "raise RuntimeError('not yet')\n")
    assert "RuntimeError: not yet" in refused(str(path))
    path.write_text(textwrap.dedent(RENEWAL))
    assert list(discover([str(path)], builtins=())) == ["renewal"]


def test_a_module_without_jobs(write: Callable[..., Path]) -> None:
    only_base = write(
        "empty.py",
        "import batchrun\nfrom batchrun import Job\n\nclass Base(batchrun.Job):\n    pass\n",
    )
    assert refused(str(only_base)) == (
        f"--jobs {only_base}: defines no batchrun.Job subclass with a name"
    )


@pytest.mark.parametrize(
    ("name", "attrs", "body", "problem"),
    [
        ("Bad Name", "", None, "name 'Bad Name' does not match [a-z][a-z0-9_-]{0,31}"),
        ("a" * 33, "", None, f"name '{'a' * 33}' does not match [a-z][a-z0-9_-]{{0,31}}"),
        ("x", "period = 'week'\n", None, "period 'week' is not one of year, month, day"),
        ("x", "once_per = 'hour'\n", None, "once_per 'hour' is not one of year, month, day"),
        (
            "x",
            "period = 'month'\nonce_per = 'day'\n",
            None,
            "once_per 'day' is shorter than period 'month'",
        ),
        (
            "x",
            "period = 'year'\nonce_per = 'month'\n",
            None,
            "once_per 'month' is shorter than period 'year'",
        ),
        ("x", "", "async def process(self, ctx, row):\n    pass\n", "does not define page()"),
        ("x", "", "async def page(self, ctx, a, n):\n    return []\n", "does not define process()"),
        (
            "x",
            "",
            "async def page(self, ctx, a, n):\n    return []\ndef process(self, ctx, row):\n"
            "    pass\n",
            "process() is not an async def",
        ),
        (
            "x",
            "",
            "def page(self, ctx, a, n):\n    return []\nasync def process(self, ctx, row):\n"
            "    pass\n",
            "page() is not an async def",
        ),
        (
            "x",
            "def prepare(self, ctx, rows):\n    pass\n",
            None,
            "prepare() is not an async def",
        ),
        (
            "x",
            "def __init__(self, db):\n    self.db = db\n",
            None,
            "cannot create: TypeError: ",
        ),
    ],
)
def test_contract_breaks(
    write: Callable[..., Path], name: str, attrs: str, body: str | None, problem: str
) -> None:
    path = write("job.py", job_source(name=name, attrs=attrs, body=body))
    message = refused(str(path))
    assert message.startswith(f"--jobs {path}: class Thing: {problem}"), message


def test_once_per_as_long_as_period_or_longer_is_fine(write: Callable[..., Path]) -> None:
    path = write("job.py", job_source(attrs="period = 'day'\nonce_per = 'year'\n"))
    assert discover([str(path)], builtins=()).describe()[0]["once_per"] == "year"


def test_two_jobs_with_one_name(write: Callable[..., Path]) -> None:
    first = write("a/renewal.py", RENEWAL)
    second = write("b/renewal.py", RENEWAL.replace("RenewalReminder", "Renewal2"))
    assert refused(str(first), str(second)) == (
        f"two jobs named 'renewal': RenewalReminder ({first.resolve()}) "
        f"and Renewal2 ({second.resolve()})"
    )
    # a subclass that keeps its parent's name is a second job with that name
    inherits = write(
        "c/renewal.py", RENEWAL + "\n    class Again(RenewalReminder):\n        pass\n"
    )
    assert refused(str(inherits)).startswith("two jobs named 'renewal': RenewalReminder (")


def test_a_misspelled_attribute_is_warned_about_not_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``peroid = "day"`` left the job monthly, and nothing pointed back to the typo."""

    class Typo(batchrun.Job):
        name = "typo"
        peroid = "day"
        once_pre = "year"

        async def page(self, ctx: Any, after: int, limit: int) -> list[dict[str, Any]]:
            return []

        async def process(self, ctx: Any, row: dict[str, Any]) -> None:
            pass

    class Own(Typo):  # a constant of its own beside the real attribute: not a typo
        name = "own"
        period = "day"
        periods = ("day", "week")
        peroid = "day"  # close to period, but period is there

        async def prepared(self, ctx: Any) -> None:  # a method of its own, not prepare
            pass

        @property
        def templated(self) -> str:
            return "x"

    with caplog.at_level("WARNING", logger="batchrun.registry"):
        registry.check_job(Typo)
        registry.check_job(Own)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "class test_a_misspelled_attribute_is_warned_about_not_ignored.<locals>.Typo: "
        "'peroid' is nothing batchrun reads: did you mean 'period'?",
        "class test_a_misspelled_attribute_is_warned_about_not_ignored.<locals>.Typo: "
        "'once_pre' is nothing batchrun reads: did you mean 'once_per'?",
    ]


def test_a_task_jobs_serial_is_entity_or_none() -> None:
    """``serial = "Entity"`` ran an entity's tasks at once and in any order, unsaid."""

    class Upload(batchrun.Task):
        name = "upload"
        serial = "Entity"  # type: ignore[assignment]

        async def process(self, ctx: Any, task: Any) -> None:
            pass

    with pytest.raises(UsageError, match="serial 'Entity' is not one of entity, none"):
        registry.check_job(Upload)
    Upload.serial = "none"
    registry.check_job(Upload)
    # `jobs` says which jobs take tasks (their period and once_per are unused)
    entry = registry._entry(Upload, "here", "class Upload")
    assert [j["kind"] for j in registry.Registry([entry]).describe()] == ["task"]


def test_a_jobs_counters_that_clash_or_are_a_string_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``counters = ("failed",)`` overwrote the run's own failed count in the JSON;
    ``counters = "pings"`` counted p, i, n, g and s. Both loaded before, so both load
    now, said in a warning: the first reported as ``job_failed``, the second one name."""

    class Counting(batchrun.Job):
        name = "counting"
        counters = ("pings", "failed")

        async def page(self, ctx: Any, after: int, limit: int) -> list[dict[str, Any]]:
            return []

        async def process(self, ctx: Any, row: dict[str, Any]) -> None:
            pass

    with caplog.at_level(logging.WARNING, logger="batchrun"):
        registry.check_job(Counting)
        Counting.counters = "pings"  # type: ignore[assignment]
        registry.check_job(Counting)
    said = [r.getMessage() for r in caplog.records]
    assert any(
        "'failed' is a key of the run's summary: reported as 'job_failed'" in m for m in said
    )
    assert any("counters 'pings' is a string: read as ('pings',)" in m for m in said)
    assert new_summary(Counting(), parse("month", "2025-06"), False).counters == {"pings": 0}
    Counting.counters = ("pings", "")
    with pytest.raises(UsageError, match="counters: '' is not a name"):
        registry.check_job(Counting)


def test_a_counter_that_takes_a_summary_key_never_raises_and_never_overwrites() -> None:
    """``ctx.count("failed")`` after the job's email went out: raising there had the
    entity retried and the email sent again; counting there overwrote the run's count."""
    summary = Summary(job="counting", period="2025-06", dry_run=False, counters={"pings": 0})
    summary.count("pings", 2)
    summary.count("extra", 1)  # undeclared: shown in this run's JSON
    for key in ("failed", "eligible", "job", "month"):
        summary.count(key, 5)
    data = summary.to_json()
    assert (data["failed"], data["eligible"], data["pings"], data["extra"]) == (0, 0, 2, 1)
    assert (data["job"], data["job_failed"], data["job_month"]) == ("counting", 5, 5)

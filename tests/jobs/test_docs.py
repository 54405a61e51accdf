"""Every code block in README.md and docs/*.md runs, and operations.md names every command.

The rules (docs/development.md says the same), per Markdown file, in order, in one new
temporary folder per file (README.md and docs/operations.md start in a folder that has a
demo database: `batchrun db migrate` and `batchrun db seed --users 2000`):

- a block whose first line is ``# NAME.py`` (or ``# NAME.py: what it is``), or any block
  right after ``<!-- file: PATH -->``, is saved under that name. A saved ``.py`` defining a
  ``batchrun.Job`` must load through ``batchrun --jobs ./NAME.py jobs``; a ``test_*.py``
  runs under pytest; any other ``.py`` must be run by a later shell block.
- ``sh`` blocks run with ``bash -e -o pipefail`` (``batchrun`` from this venv first on
  PATH, no ``BATCHRUN_*`` variable but those the file's earlier blocks exported), and must
  exit 0. Before the fence, ``<!-- doc-test: syntax -->`` checks the syntax only
  (``bash -n``: ``make``, cron lines), and ``<!-- doc-test: help -->`` also checks each
  ``batchrun`` line against the help: its command exists and takes every ``--option`` it
  names (for blocks that need MySQL, SMTP, SES or SQS).
- ``python`` blocks must be files (above). ``ini`` blocks must parse. Blocks with no
  language (or ``text``) are output, and are not run.
"""

from __future__ import annotations

import configparser
import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from support import ROOT

from batchrun.cli import GLOBAL_VALUES, app, hoist_global_options

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WITH_DEMO_DB = {"README.md", "operations.md"}
BIN = Path(sys.executable).parent
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"<!--\s*(doc-test|file):\s*(\S+)\s*-->")
_FILENAME = re.compile(r"^#\s*([\w./-]+\.py)\b")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str
    marker: str | None = None  # doc-test: syntax | help
    path: str | None = None  # the file it is saved as

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang or 'output'})"


def blocks(doc: Path) -> Iterator[Block]:
    """The fenced blocks of ``doc``, with the marker comment right before each."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    pending: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence is None:
            marker = _MARKER.search(line)
            if marker is not None:
                pending = (marker[1], marker[2])
            elif line.strip():
                pending = None
            i += 1
            continue
        indent, lang = fence[1], fence[2]
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        block = Block(doc.name, i - len(body), lang, "\n".join(body) + "\n")
        if pending is not None:
            kind, value = pending
            if kind == "file":
                block.path = value
            else:
                block.marker = value
        elif lang == "python" and (named := _FILENAME.match(body[0] if body else "")):
            block.path = named[1]
        pending = None
        i += 1
        yield block


def _env(exported: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200", NO_COLOR="1")
    env.update(exported)
    return env


def _bash(script: str, cwd: Path, env: dict[str, str], *, check_only: bool = False) -> None:
    args = ["bash", "-n"] if check_only else ["bash", "-e", "-o", "pipefail"]
    done = subprocess.run(
        [*args, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{script}\n{done.stdout}\n{done.stderr}"


@functools.cache
def _help_of(path: tuple[str, ...]) -> str:
    done = subprocess.run(
        [str(BIN / "batchrun"), *path, "--help"],
        env={**_env({}), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"batchrun {' '.join(path)} --help: {done.stderr}"
    return done.stdout


def _check_help(block: Block) -> None:
    """Each ``batchrun`` line names a command that exists, with options it takes."""
    root_help = _help_of(())
    for raw in block.text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line.startswith("batchrun "):
            continue
        for command in line.split("&&"):
            words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
            if not words or words[0] != "batchrun":
                continue
            path: list[str] = []
            rest = hoist_global_options(words[1:])
            while rest and rest[0].startswith("-"):  # global options: the root help has them
                option = rest.pop(0)
                if option in GLOBAL_VALUES and rest:
                    rest.pop(0)
            while rest and not rest[0].startswith("-") and _is_command([*path, rest[0]]):
                path.append(rest.pop(0))
            assert path, f"{block}: no command in {command!r}"
            helped = _help_of(tuple(path)) + root_help
            for word in rest:
                if word.startswith("--"):
                    option = word.split("=", 1)[0]
                    assert option in helped, f"{block}: {' '.join(path)} takes no {option}"


def _is_command(path: list[str]) -> bool:
    command = typer.main.get_command(app)
    for name in path:
        sub = getattr(command, "commands", {}).get(name)
        if sub is None:
            return False
        command = sub
    return True


def _demo_db(tmp: Path, env: dict[str, str]) -> None:
    _bash("batchrun db migrate && batchrun db seed --users 2000", tmp, env)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_code_block_runs(doc: Path, tmp_path: Path) -> None:
    exported: dict[str, str] = {}
    if doc.name in WITH_DEMO_DB:
        _demo_db(tmp_path, _env(exported))
    scripts: list[str] = []
    ran = ""
    for block in blocks(doc):
        env = _env(exported)
        if block.path is not None:
            target = tmp_path / block.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
            if target.suffix == ".py":
                compile(block.text, str(target), "exec")
                if "batchrun.Job)" in block.text:
                    _bash(f"batchrun --jobs ./{block.path} jobs --json", tmp_path, env)
                elif target.name.startswith("test_"):
                    _bash(f"python -m pytest -q -p no:cacheprovider {block.path}", tmp_path, env)
                else:
                    scripts.append(block.path)
            continue
        if block.lang == "python":
            pytest.fail(f"{block}: a python block must start with `# NAME.py`")
        if block.lang == "ini":
            parser = configparser.ConfigParser(strict=False, interpolation=None)
            parser.read_string(block.text)
            assert parser.sections(), f"{block}: no section"
        if block.lang != "sh":
            continue
        if block.marker in ("syntax", "help"):
            _bash(block.text, tmp_path, env, check_only=True)
            if block.marker == "help":
                _check_help(block)
            continue
        assert block.marker is None, f"{block}: unknown marker {block.marker!r}"
        saved = tmp_path / ".doc-test-env"
        _bash(f"{block.text}\nenv -0 > {shlex.quote(str(saved))}", tmp_path, env)
        ran += block.text
        for pair in saved.read_text(encoding="utf-8").split("\0"):
            name, _, value = pair.partition("=")
            if name.startswith("BATCHRUN_"):
                exported[name] = value  # what the block exported, for the blocks after it
    if any(b.lang == "sh" and b.marker is None for b in blocks(doc)):
        assert ran, f"{doc.name}: its shell blocks did not run"
    unrun = [s for s in scripts if s not in ran]
    assert not unrun, f"{doc.name}: no shell block runs {unrun}"


def test_every_command_and_option_is_in_operations_md() -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    missing: list[str] = []

    def walk(command: object, path: list[str]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
            return
        if f"`batchrun {' '.join(path)}" not in text:
            missing.append(f"batchrun {' '.join(path)}")
        for param in getattr(command, "params", []):
            for option in getattr(param, "opts", []):
                if option.startswith("--") and f"`{option}" not in text:
                    missing.append(f"batchrun {' '.join(path)} {option}")

    walk(typer.main.get_command(app), [])
    assert not missing, f"docs/operations.md does not mention: {missing}"


def test_blocks_are_found_with_their_markers() -> None:
    """The parser itself: a file marker, a doc-test marker, a named python block."""
    found = {b.path or b.marker or b.lang for d in DOCS for b in blocks(d)}
    assert {"greetings.py", "syntax", "help", "templates/renewal/body.html"} <= found, found

"""Summarize a py-spy ``--format raw`` (collapsed stacks) profile: where the CPU goes.

``python -m bench.profile FILE [--top 25]`` prints the functions with the most samples on
top of the stack (self) and anywhere in it (inclusive), and the share of each library.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass, field

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

# Library areas by path fragment, first match wins.
AREAS = (
    ("jinja2/", "jinja2"),
    ("batchrun/", "batchrun"),
    ("email/", "email (stdlib)"),
    ("aiosmtplib/", "aiosmtplib"),
    ("aiomysql/", "aiomysql"),
    ("pymysql/", "pymysql"),
    ("asyncio/", "asyncio"),
    ("typer/", "cli startup"),
    ("click/", "cli startup"),
    ("rich/", "rich"),
    ("<frozen importlib", "imports"),
)


@dataclass
class Profile:
    """Sample counts by function and by area."""

    total: int = 0  # samples of the main thread
    background: int = 0  # samples of other threads (executor workers, mostly idle waits)
    self_by_func: Counter[str] = field(default_factory=Counter)
    incl_by_func: Counter[str] = field(default_factory=Counter)
    self_by_area: Counter[str] = field(default_factory=Counter)


def area_of(path: str) -> str:
    """The library a source file belongs to."""
    if path.endswith((".html", ".txt")):
        return "templates (compiled Jinja2)"
    for fragment, name in AREAS:
        if path.startswith(fragment) or "/" + fragment in path:
            return name
    return "other"


def load(path: str) -> Profile:
    """Read a collapsed-stack file (``frame;frame;... count`` per line)."""
    profile = Profile()
    with open(path) as f:
        for line in f:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = []
            for raw in stack.split(";"):
                m = _FRAME.match(raw)
                if m:
                    frames.append((m["func"], m["file"]))
            if not frames:
                continue
            # py-spy counts a thread blocked in queue.get as active: keep other threads
            # apart so that shares are of the event loop's thread.
            if any(fn == "Thread._bootstrap" for fn, _ in frames):
                profile.background += count
                continue
            profile.total += count
            func, file = frames[-1]
            profile.self_by_func[f"{func} ({short(file)})"] += count
            profile.self_by_area[area_of(file)] += count
            # Inclusive time below the event loop: what one callback or task step costs.
            starts = [i for i, (fn, _) in enumerate(frames) if fn == "Handle._run"]
            below = frames[starts[-1] + 1 :] if starts else frames
            for name in {f"{fn} ({short(fl)})" for fn, fl in below}:
                profile.incl_by_func[name] += count
    return profile


def short(path: str) -> str:
    """A path from its package onwards."""
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def report(profile: Profile, top: int = 20) -> str:
    """A plain-text summary."""
    total = profile.total or 1
    lines = [f"{profile.total} samples of the main thread ({profile.background} in others)"]
    lines.append("self time by area:")
    for name, n in profile.self_by_area.most_common():
        lines.append(f"  {100 * n / total:5.1f}%  {name}")
    lines.append(f"top {top} functions by self time:")
    for name, n in profile.self_by_func.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}%  {name}")
    lines.append(f"top {top} functions by inclusive time, below the event loop:")
    for name, n in profile.incl_by_func.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}%  {name}")
    return "\n".join(lines)


def main() -> None:
    """Print the summary of one profile file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    print(report(load(args.file), args.top))


if __name__ == "__main__":
    main()

"""Build the AWS Lambda deployment zip: batchrun with its ``aws`` extra, for one platform.

    python deploy/build_lambda.py --arch x86_64 --python 3.12 --out dist/batchrun-lambda.zip
    python deploy/build_lambda.py --arch arm64  --python 3.12 --out dist/batchrun-lambda-arm64.zip
    python deploy/build_lambda.py --arch local  --out /tmp/x.zip   # this interpreter, for tests

Steps: build batchrun's wheel from a clean copy of the source (so a stale ``build/`` cannot
leak into it, and the checkout is not written to), then one ``pip install --target`` of
``batchrun[aws,http]`` so pip resolves every dependency once, the pinned botocore that
aiobotocore needs included (the runtime's own boto3 is older and sits later on
``sys.path``). For a Lambda arch pip only takes wheels (``--only-binary=:all:``) for
CPython ``--python`` on manylinux up to glibc 2.34 (Amazon Linux 2023, the python3.12
runtime). A dependency published only as an sdist is pure Python in practice: name it with
``--build-pure NAME`` and it is built here into a local wheelhouse pip may use.

Then what the handler never imports goes: the command line's dependencies (typer, rich,
pydantic and theirs: ``LEFT_OUT``), boto3's S3 transfer manager and resource models, stray
top-level ``docs/`` and ``examples/`` folders some wheels ship, and every botocore service
model but the ones batchrun calls (``BOTOCORE_SERVICES``: 25 MB of 28). boto3 itself stays:
aioboto3 imports it, and the runtime's own boto3 is built for an older botocore than the one
aiobotocore pins. Console scripts (``bin/``) and ``__pycache__`` go, ``direct_url.json`` goes
(it holds this machine's temporary path), the rest of each kept ``*.dist-info`` stays
(importlib.metadata reads it). When an interpreter of the target version is at hand (this
one for ``local``, else ``--compile-with`` or ``pythonX.Y`` on PATH), every module is
compiled to an unchecked-hash ``.pyc``: ``/var/task`` is read-only, so without them every
cold start compiles each imported module from source again. The zip is deterministic:
sorted entries, fixed timestamps and modes, so the same inputs give the same bytes.

pip's usual variables apply (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX`` ...).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHES = {"x86_64": "x86_64", "arm64": "aarch64"}
# python3.12 on Lambda runs on Amazon Linux 2023: glibc 2.34. manylinux2014 == manylinux_2_17.
GLIBC_MAX = 34
GLIBC_MIN = 17
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "setup.py", "setup.cfg")
LAMBDA_TASK_ROOT = "/var/task"
# Distributions pip resolves for batchrun[aws,http] that the handler never imports: the CLI's
# (typer, rich) and what they pull in, prometheus-client (`batchrun metrics` and the
# dashboard only), and boto3's S3 transfer manager.
LEFT_OUT = (
    "prometheus-client",
    "typer",
    "click",
    "rich",
    "pygments",
    "markdown-it-py",
    "mdurl",
    "shellingham",
    "colorama",
    "pydantic",
    "pydantic-core",
    "typing-inspection",
    "annotated-types",
    "annotated-doc",
    "s3transfer",
)
# The AWS services batchrun calls (SES v2 and v1 for the quota, SQS, Secrets Manager; STS
# for web-identity credentials); botocore's other service models are left out.
BOTOCORE_SERVICES = ("ses", "sesv2", "sqs", "secretsmanager", "sts")
# Top-level folders some wheels install by mistake (aiomysql: docs/, examples/).
STRAY_TOP = ("docs", "examples", "tests")


def platform_args(arch: str, python: str) -> list[str]:
    """pip's flags for wheels that run on Lambda's ``arch`` with CPython ``python``."""
    machine = ARCHES[arch]
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MAX, GLIBC_MIN - 1, -1)]
    # The legacy alias expands to manylinux2010/manylinux1 inside pip.
    platforms.append(f"manylinux2014_{machine}")
    args = ["--implementation", "cp", "--python-version", python, "--only-binary=:all:"]
    for platform in platforms:
        args += ["--platform", platform]
    return args


def _run(cmd: Sequence[str | Path], *, quiet: bool, env: Mapping[str, str] | None = None) -> None:
    printable = " ".join(str(c) for c in cmd)
    if not quiet:
        print(f"+ {printable}", file=sys.stderr, flush=True)
    result = subprocess.run(
        [str(c) for c in cmd],
        capture_output=quiet,
        text=True,
        check=False,
        timeout=1800,
        env=None if env is None else {**os.environ, **env},
    )
    if result.returncode != 0:
        if quiet:
            sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"build_lambda: command failed ({result.returncode}): {printable}")


def _copy_source(dest: Path) -> Path:
    """The files a wheel build reads, without caches or a stale build/ directory."""
    for name in SOURCE_FILES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "batchrun", dest / "batchrun", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    return dest


def build_wheel(work: Path, *, quiet: bool) -> Path:
    """batchrun's own wheel (the ``sql/**.sql`` files and ``py.typed`` come along)."""
    source = _copy_source(Path(tempfile.mkdtemp(dir=work, prefix="src-")))
    wheels = work / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, source],
        quiet=quiet,
    )
    (wheel,) = wheels.glob("batchrun-*.whl")
    return wheel


def build_pure(work: Path, names: Sequence[str], *, quiet: bool) -> Path | None:
    """Wheels for sdist-only (pure Python) dependencies, for ``--find-links``."""
    if not names:
        return None
    house = work / "wheelhouse"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", house, *names],
        quiet=quiet,
    )
    return house


def install(
    target: Path, wheel: Path, arch: str, python: str, house: Path | None, *, quiet: bool
) -> None:
    """One resolution of ``batchrun[aws,http]`` into ``target``."""
    cmd: list[str | Path] = [sys.executable, "-m", "pip", "install", "--target", target]
    cmd += ["--no-compile", "--no-warn-script-location", "--disable-pip-version-check"]
    # --target resolves on its own (pip ignores what is installed here), but its conflict
    # report compares the result with this environment's packages: noise for another box.
    cmd.append("--no-warn-conflicts")
    if quiet:
        cmd.append("-q")
    if arch != "local":
        cmd += platform_args(arch, python)
    if house is not None:
        cmd += ["--find-links", house]
    cmd.append(f"{wheel}[aws,http]")  # http: ctx.http, for jobs that call a named backend
    _run(cmd, quiet=quiet)


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _record_paths(info: Path) -> list[Path]:
    """The files a ``*.dist-info`` says its distribution installed (itself included)."""
    record = info / "RECORD"
    if not record.exists():
        return []
    paths = []
    for line in record.read_text().splitlines():
        name = line.rsplit(",", 2)[0]
        if name and not name.startswith(".."):
            paths.append(info.parent / name)
    return paths


def leave_out(target: Path, names: Sequence[str] = LEFT_OUT) -> list[str]:
    """Remove the distributions ``names`` (files, then emptied folders); returns those found."""
    wanted = {_normal(n) for n in names}
    removed = []
    for info in sorted(target.glob("*.dist-info")):
        dist = _normal(info.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        if dist not in wanted:
            continue
        folders: set[Path] = set()
        for path in _record_paths(info):
            if path.is_file():
                path.unlink()
            folders.update(p for p in path.parents if target in p.parents)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        shutil.rmtree(info, ignore_errors=True)
        removed.append(dist)
    return removed


def slim_aws(target: Path) -> None:
    """Keep botocore's models of the services batchrun calls; drop boto3's resource models."""
    data = target / "botocore" / "data"
    if data.is_dir():
        for entry in data.iterdir():
            if entry.is_dir() and entry.name not in BOTOCORE_SERVICES:
                shutil.rmtree(entry)
    shutil.rmtree(target / "boto3" / "data", ignore_errors=True)
    shutil.rmtree(target / "boto3" / "examples", ignore_errors=True)


def prune(target: Path) -> None:
    """Drop what Lambda never uses or what ties the build to this machine."""
    leave_out(target)
    slim_aws(target)
    for name in STRAY_TOP:
        shutil.rmtree(target / name, ignore_errors=True)
    shutil.rmtree(target / "bin", ignore_errors=True)
    for cache in sorted(target.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    for stray in target.rglob("*.pyc"):
        stray.unlink()
    for info in target.glob("*.dist-info"):
        direct = info / "direct_url.json"
        if direct.exists():
            direct.unlink()
            record = info / "RECORD"
            if record.exists():
                lines = record.read_text().splitlines(keepends=True)
                kept = [line for line in lines if not line.startswith(f"{info.name}/direct_url")]
                record.write_text("".join(kept))


def _version_of(interpreter: str) -> str | None:
    """``X.Y`` of an interpreter, or None when it does not run (a pyenv shim, say)."""
    try:
        out = subprocess.run(
            [interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_compiler(arch: str, python: str, explicit: str | None) -> str | None:
    """An interpreter of the target version to compile with, or None."""
    if explicit:
        found = _version_of(explicit)
        if found != python:
            raise SystemExit(f"build_lambda: --compile-with {explicit} is {found}, not {python}")
        return explicit
    if arch == "local":
        return sys.executable
    candidates = [f"python{python}"]
    if f"{sys.version_info.major}.{sys.version_info.minor}" == python:
        candidates.insert(0, sys.executable)
    for candidate in candidates:
        path = shutil.which(candidate) or candidate
        if _version_of(path) == python:
            return path
    return None


def compile_all(target: Path, interpreter: str, *, quiet: bool) -> None:
    """Unchecked-hash .pyc files: used without stat-ing the source, same bytes every build."""
    _run(
        [
            interpreter,
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            "-s",
            target,
            "-p",
            LAMBDA_TASK_ROOT,
            target,
        ],
        quiet=quiet,
        # Set constants are marshalled in iteration order, which string hashing decides.
        env={"PYTHONHASHSEED": "0"},
    )


def _files(target: Path) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(target):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            yield path.relative_to(target).as_posix(), path


def write_zip(target: Path, out: Path) -> int:
    """A deterministic zip of ``target``; returns the number of files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".part")
    count = 0
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, path in sorted(_files(target)):
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the mode below is honoured
            executable = os.access(path, os.X_OK) or path.suffix == ".so"
            info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            archive.writestr(info, path.read_bytes(), compresslevel=9)
            count += 1
    partial.replace(out)
    return count


def build(
    arch: str,
    python: str,
    out: Path,
    *,
    pure: Sequence[str] = (),
    compile_with: str | None = None,
    compile_pyc: bool = True,
    quiet: bool = False,
    jobs_dir: Path | None = None,
) -> Path:
    """Build the zip and return its path.

    ``jobs_dir``: a folder of job modules (with their sql/ and templates/) bundled at the
    zip's top level, for ``BATCHRUN_JOBS=/var/task/<folder>/job.py`` (or a module name).
    """
    with tempfile.TemporaryDirectory(prefix="batchrun-lambda-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work, quiet=quiet)
        house = build_pure(work, pure, quiet=quiet)
        target = work / "package"
        install(target, wheel, arch, python, house, quiet=quiet)
        prune(target)
        if jobs_dir is not None:
            shutil.copytree(
                jobs_dir,
                target / jobs_dir.name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        interpreter = find_compiler(arch, python, compile_with) if compile_pyc else None
        if interpreter is not None:
            compile_all(target, interpreter, quiet=quiet)
        elif compile_pyc:
            print(
                f"build_lambda: no python{python} found; the zip has no .pyc files "
                "(pass --compile-with PATH to add them)",
                file=sys.stderr,
            )
        count = write_zip(target, out)
        unpacked = sum(p.stat().st_size for _, p in _files(target))
    print(
        f"{out}: {out.stat().st_size / 1e6:.1f} MB zipped, {unpacked / 1e6:.1f} MB unpacked, "
        f"{count} files ({arch}, CPython {python}, pyc: {'yes' if interpreter else 'no'})",
        file=sys.stderr,
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=[*ARCHES, "local"], default="x86_64")
    parser.add_argument(
        "--python", default=None, help="target CPython X.Y (default 3.12; local: this one)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "batchrun-lambda.zip")
    parser.add_argument(
        "--build-pure",
        action="append",
        default=[],
        metavar="NAME",
        help="build this sdist-only pure-Python dependency locally (repeatable)",
    )
    parser.add_argument(
        "--jobs-dir",
        type=Path,
        metavar="DIR",
        help="bundle this folder of job modules at the zip's top level (BATCHRUN_JOBS)",
    )
    parser.add_argument("--compile-with", metavar="PYTHON", help="interpreter for the .pyc files")
    parser.add_argument("--no-compile", action="store_true", help="ship sources only")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    python = args.python or (here if args.arch == "local" else "3.12")
    if args.arch == "local" and python != here:
        parser.error(f"--arch local builds for this interpreter ({here}), not {python}")
    build(
        args.arch,
        python,
        args.out,
        pure=args.build_pure,
        compile_with=args.compile_with,
        compile_pyc=not args.no_compile,
        quiet=args.quiet,
        jobs_dir=args.jobs_dir,
    )


if __name__ == "__main__":
    main()

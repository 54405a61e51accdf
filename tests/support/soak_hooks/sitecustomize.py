"""A test-only fault hook for the soak's ``python -m batchrun`` subprocesses (never shipped).

``tests/guarantees/test_soak.py`` puts this folder first on ``PYTHONPATH`` for the CLI processes it
spawns; Python imports ``sitecustomize`` at start-up, before ``batchrun``. It does nothing
unless ``BATCHRUN_SOAK_HEARTBEAT_FAIL`` is set:

- ``BATCHRUN_SOAK_HEARTBEAT_FAIL=0.3``: once ``batchrun.db.store`` is imported,
  ``Store.heartbeat`` raises ``DatabaseError("injected heartbeat failure")`` (before it
  reaches the database) for 30% of its calls, at random;
- ``BATCHRUN_SOAK_HEARTBEAT_SEED``: the random choices are seeded from it and the pid, so
  every process fails differently and a seed replays;
- ``BATCHRUN_SOAK_HEARTBEAT_LOG``: a file each call appends one line to, ``<pid> fail`` or
  ``<pid> pass`` (passed on to the database), before the call goes on (one ``O_APPEND``
  write per call, so SIGKILLed processes and cancelled heartbeats count too).

The patch waits for ``batchrun.db.store`` to be imported (a finder on ``sys.meta_path``)
rather than importing it here: at start-up ``sys.path`` does not hold the script's folder
yet, so importing batchrun now could load another copy than the one the process runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import random
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_TARGET = "batchrun.db.store"


def _record(log: str | None, outcome: str) -> None:
    if not log:
        return
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {outcome}\n".encode())
    finally:
        os.close(fd)


def _patch(module: ModuleType, rate: float, seed: str, log: str | None) -> None:
    from batchrun.errors import DatabaseError

    store_class: Any = module.Store
    real = store_class.heartbeat
    rng = random.Random(f"{seed}:{os.getpid()}")

    async def heartbeat(self: Any, *args: Any, **kwargs: Any) -> int:
        if rng.random() < rate:
            _record(log, "fail")
            raise DatabaseError("injected heartbeat failure")
        # Recorded before the call: a heartbeat cancelled or killed in flight still counts.
        _record(log, "pass")
        renewed: int = await real(self, *args, **kwargs)
        return renewed

    heartbeat.__wrapped__ = real  # type: ignore[attr-defined]
    store_class.heartbeat = heartbeat


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, then: Any) -> None:
        self.inner = inner
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.then(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, then: Any) -> None:
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # once, and let the real finders find it
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.then)
        return spec


def _install() -> None:
    raw = os.environ.get("BATCHRUN_SOAK_HEARTBEAT_FAIL", "")
    if not raw or float(raw) <= 0:
        return
    rate = float(raw)
    seed = os.environ.get("BATCHRUN_SOAK_HEARTBEAT_SEED", "0")
    log = os.environ.get("BATCHRUN_SOAK_HEARTBEAT_LOG") or None
    sys.meta_path.insert(0, _Finder(lambda module: _patch(module, rate, seed, log)))


_install()

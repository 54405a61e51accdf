"""The dashboard for tests: its app over a database (in-process, Starlette's TestClient) or
``batchrun ui`` as a real server in a subprocess, on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
from starlette.applications import Starlette

from batchrun.jobs.birthday import Birthday
from batchrun.runtime import Runtime
from batchrun.runtime.resources import open_backends
from batchrun.settings import Settings
from batchrun.ui.app import create_app
from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def make_app(settings: Settings, *, token: str | None = None, read_only: bool = False) -> Starlette:
    """The dashboard's app over ``settings``' database and queue, for the birthday job."""

    @contextlib.asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        job = Birthday()
        async with open_backends(settings, queue=True, jobs=[job]) as backends:
            yield Runtime(job, backends.store, backends.mailer, backends.queue, settings)

    return create_app(open_runtime, token=token, read_only=read_only)


@contextlib.asynccontextmanager
async def client_of(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client over the app in-process, its lifespan (the runtime) open meanwhile."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found is not None, "no CSRF token in the page"
    return found.group(1)


@contextlib.contextmanager
def serve(env: dict[str, str], *args: str) -> Iterator[str]:
    """``batchrun ui`` in a subprocess on a free port; yields its base URL."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    process = subprocess.Popen(
        [sys.executable, "-m", "batchrun", "ui", "--port", str(port), *args],
        env=full,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise AssertionError(f"batchrun ui exited: {process.stderr.read()}")  # type: ignore[union-attr]
            try:
                urllib.request.urlopen(base + "/metrics", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()

"""``python -m batchrun`` in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from support import ROOT


def run_cli(
    *args: str,
    env: dict[str, str],
    timeout: float = 60,
    check: bool = False,
    sigterm_after: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batchrun`` in a subprocess with ``env`` added to a clean environment.

    ``sigterm_after``: send SIGTERM after that many seconds (a worker runs until then).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    full.update(env)
    if sigterm_after is not None:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchrun", *args],
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            out, err = process.communicate(timeout=sigterm_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return subprocess.run(
        [sys.executable, "-m", "batchrun", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        cwd=ROOT,
    )

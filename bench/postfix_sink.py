"""Postfix's ``smtp-sink`` as the bench's second SMTP sink: a C server, no latency.

``smtp-sink -c`` writes its running counters (``sess=N quit=N mesg=N``) to stdout after
every message and session; the bench sends them to a file and reads the last one. It
answers like the bench's own sink (``bench/smtp_sink.py``): ``command("reset")`` and
``command("stats")`` return ``messages, connections, bytes, cpu_s`` (``bytes`` is 0:
smtp-sink does not count them; ``cpu_s`` is from ``/proc/<pid>/stat``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import mysqlstat

SMTP_SINK = "/usr/sbin/smtp-sink"
_COUNTERS = re.compile(rb"sess=(\d+) quit=\d+ mesg=(\d+)")


def missing() -> str | None:
    """Why smtp-sink cannot be used here (None when it can)."""
    if not os.access(SMTP_SINK, os.X_OK):
        return f"{SMTP_SINK} not found (Debian: apt-get install postfix)"
    return None


class PostfixSink:
    """``smtp-sink`` on a free loopback port, as a child process, until ``close()``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="bench-smtp-sink-")
        self.counters_path = Path(self.dir.name) / "counters"
        self.port = _free_port(host)
        cmd = [SMTP_SINK, "-c", "-m", "4096"]  # -m: connections served at once (256)
        if os.geteuid() == 0:
            cmd += ["-u", "nobody"]  # it refuses to run as root without one
        cmd += [f"{host}:{self.port}", "4096"]  # the listen backlog, as bench.smtp_sink's
        # Its own descriptors, opened for appending: reading never moves its write offset.
        with (
            open(self.counters_path, "ab") as out,
            open(Path(self.dir.name) / "stderr", "ab") as err,
        ):
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        try:
            self._wait_listening(host)
        except RuntimeError:
            self.close()
            raise
        self.base = self._counters()

    def _wait_listening(self, host: str) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                why = (Path(self.dir.name) / "stderr").read_text(errors="replace")[-500:]
                why = why.strip() or "nothing on stderr"
                raise RuntimeError(f"smtp-sink exited with status {self.proc.returncode} ({why})")
            try:
                with socket.create_connection((host, self.port), timeout=1) as s:
                    s.sendall(b"QUIT\r\n")
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"smtp-sink did not listen on {host}:{self.port} within 10 s")
        # The probe's session counts once it has ended: wait for it, so reset starts clean.
        while time.monotonic() < deadline and self._counters()[0] < 1:
            time.sleep(0.01)

    def _counters(self) -> tuple[int, int]:
        """(sessions ended, messages) since it started."""
        with open(self.counters_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 200))
            found = _COUNTERS.findall(f.read())
        return (int(found[-1][0]), int(found[-1][1])) if found else (0, 0)

    def command(self, name: str) -> dict[str, Any]:
        """``stats`` or ``reset`` (answers the stats before it), as bench.smtp_sink."""
        sessions, messages = self._counters()
        stats = {
            "messages": messages - self.base[1],
            "connections": sessions - self.base[0],
            "bytes": 0,
            "cpu_s": mysqlstat.process_cpu_s(self.proc.pid) or 0.0,
        }
        if name == "reset":
            self.base = (sessions, messages)
        return stats

    def close(self) -> None:
        """Stop it and reap it."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

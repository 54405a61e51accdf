"""The end-of-run webhook (BATCHRUN_NOTIFY_URL) against a real local HTTP server: its
payload, a receiver that hangs, one that is not there."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import run_cli
from support.http_server import GrantsTestServer
from support.ports import free_port
from support.smtp_server import SmtpTestServer

from batchrun.control.notify import Notifier
from batchrun.errors import ConfigError


@pytest.fixture(scope="module")
def receiver_session() -> Iterator[GrantsTestServer]:
    with GrantsTestServer() as server:
        yield server


@pytest.fixture
def receiver(receiver_session: GrantsTestServer) -> GrantsTestServer:
    receiver_session.reset()
    return receiver_session


@pytest.fixture
def env(tmp_path: Path, smtp_server: SmtpTestServer) -> dict[str, str]:
    env = {
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}",
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": "birthday@example.com",
        "BATCHRUN_RETRY_BASE_S": "0",
    }
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "240", env=env).returncode == 0
    return env


def test_payload_of_a_run_that_left_retries(
    env: dict[str, str], receiver: GrantsTestServer, smtp_server: SmtpTestServer
) -> None:
    smtp_server.set_policy(lambda _rcpt, _n: "451 4.3.0 try again later")
    hook = {"BATCHRUN_NOTIFY_URL": f"{receiver.url}/grants"}
    result = run_cli("birthday", "--month", "2025-06", "--json", env=env | hook)
    assert result.returncode == 3, result.stderr
    [call] = receiver.calls()
    body = call.body
    summary = json.loads(result.stdout)
    runs = json.loads(run_cli("runs", "--json", env=env).stdout)
    assert body["job"] == "birthday" and body["period"] == "2025-06"
    assert (body["outcome"], body["exit_code"]) == ("retrying", 3)
    assert body["counts"]["queued_for_retry"] == summary["queued_for_retry"] > 0
    assert body["run_id"] == runs[0]["id"] and body["host"] == runs[0]["host"]
    assert body["text"].startswith("batchrun birthday 2025-06: retrying (exit 3)")


def test_failure_only_by_default_every_end_with_always(
    env: dict[str, str], receiver: GrantsTestServer
) -> None:
    hook = {"BATCHRUN_NOTIFY_URL": f"{receiver.url}/grants"}
    assert run_cli("birthday", "--month", "2025-06", env=env | hook).returncode == 0
    assert receiver.calls() == [], "an ok run tells nobody by default"
    always = hook | {"BATCHRUN_NOTIFY_ON": "always"}
    assert run_cli("birthday", "--month", "2025-07", env=env | always).returncode == 0
    [call] = receiver.calls()
    assert (call.body["outcome"], call.body["exit_code"]) == ("ok", 0)


def test_a_hanging_receiver_does_not_hold_the_run(
    env: dict[str, str], receiver: GrantsTestServer, smtp_server: SmtpTestServer
) -> None:
    receiver.delay(120)  # answers long after the 5 s timeout
    smtp_server.set_policy(lambda _rcpt, _n: "451 4.3.0 try again later")
    hook = {"BATCHRUN_NOTIFY_URL": f"{receiver.url}/grants"}
    # Bounded by the test's own timeout: the run ends about 5 s after its work.
    result = run_cli("birthday", "--month", "2025-06", "--json", env=env | hook, timeout=40)
    assert result.returncode == 3, "the exit code is the run's"
    lines = [line for line in result.stderr.splitlines() if "notification" in line]
    assert len(lines) == 1 and "no answer within 5 s" in lines[0], result.stderr


def test_a_receiver_that_is_not_there_is_one_log_line(env: dict[str, str]) -> None:
    hook = {
        "BATCHRUN_NOTIFY_URL": f"http://127.0.0.1:{free_port()}/hook",
        "BATCHRUN_NOTIFY_ON": "always",
    }
    result = run_cli("birthday", "--month", "2025-06", "--json", env=env | hook)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "notification" in line]
    assert len(lines) == 1 and "refused" in lines[0].lower(), result.stderr
    assert "Traceback" not in result.stderr


def test_bad_settings() -> None:
    with pytest.raises(ConfigError):
        Notifier.from_env({"BATCHRUN_NOTIFY_URL": "file:///etc/passwd"})
    with pytest.raises(ConfigError):
        Notifier.from_env({"BATCHRUN_NOTIFY_URL": "http://x", "BATCHRUN_NOTIFY_ON": "sometimes"})
    with pytest.raises(ConfigError, match=r"port that is not one: http://x:\?$"):
        Notifier.from_env({"BATCHRUN_NOTIFY_URL": "http://x:abc/hook?token=T0kenXYZ"})
    assert Notifier.from_env({}) is None
    notifier = Notifier.from_env({"BATCHRUN_NOTIFY_URL": "https://hooks.example/T/B/X"})
    assert notifier is not None
    assert notifier.wanted(130, dead_letters_grew=False)
    assert notifier.wanted(0, dead_letters_grew=True)
    assert not notifier.wanted(0, dead_letters_grew=False)


async def test_a_user_and_password_in_the_url_go_as_basic_auth() -> None:
    """urllib looked "user:pw@127.0.0.1" up as a host name: such a hook was never called
    ("Name or service not known"). Now the URL without them, and HTTP Basic."""
    got: list[tuple[str, str | None]] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((self.path, self.headers.get("Authorization")))
            self.send_response(204)
            self.end_headers()

        def do_GET(self) -> None:
            got.append((self.path, self.headers.get("Authorization")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    class Moved(Hook):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((self.path, self.headers.get("Authorization")))
            self.send_response(302)  # urllib follows it (as a GET) to someone else's server
            self.send_header("Location", f"http://127.0.0.1:{ports[0]}/elsewhere")
            self.end_headers()

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (Hook, Moved)]
    ports = [s.server_address[1] for s in servers]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        url = f"http://hook%40ops:p%3Ass-w0rd@127.0.0.1:{ports[0]}/services/T0K3N?x=1"
        assert await Notifier(url).send({"text": "hi"})
        expected = "Basic " + base64.b64encode(b"hook@ops:p:ss-w0rd").decode()
        assert got == [("/services/T0K3N?x=1", expected)]
        # A hook that redirects: the credentials stay with the host they were given for.
        got.clear()
        assert await Notifier(f"http://hook:pw-pw-pw@127.0.0.1:{ports[1]}/hook").send({})
        basic = "Basic " + base64.b64encode(b"hook:pw-pw-pw").decode()
        assert got == [("/hook", basic), ("/elsewhere", None)]
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            thread.join()
            server.server_close()

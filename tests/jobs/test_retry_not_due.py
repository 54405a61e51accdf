"""`batchrun retry` says when the messages it left on the queue are due."""

from __future__ import annotations

import re

from support.cli import run_cli
from support.smtp_server import SmtpTestServer


def _a_month_that_failed(env: dict[str, str], smtp_server: SmtpTestServer) -> int:
    """A migrated, seeded database whose June run found the mail server refusing every
    recipient for now (451): how many entities it queued for retry."""
    run_cli("db", "migrate", env=env, check=True)
    run_cli("db", "seed", "--users", "200", env=env, check=True)
    smtp_server.set_policy(lambda rcpt, attempt: "451 4.3.0 Try again later")
    ran = run_cli("birthday", "--month", "2025-06", env={**env, "BATCHRUN_MAIL": smtp_server.url})
    found = re.search(r"queued for retry\s+(\d+)", ran.stdout)
    assert found, ran.stdout + ran.stderr
    assert int(found.group(1)) > 1
    return int(found.group(1))


def test_a_retry_that_finds_only_backoffs_says_when_the_next_is_due(
    env: dict[str, str], smtp_server: SmtpTestServer
) -> None:
    env = {**env, "BATCHRUN_RETRY_BASE_S": "600"}
    queued = _a_month_that_failed(env, smtp_server)
    # The first retry fails again: each message comes back after its backoff, 600 s or so.
    again = run_cli("retry", env={**env, "BATCHRUN_MAIL": smtp_server.url})
    assert again.returncode == 3, again.stderr

    waiting = run_cli("retry", env=env)
    assert waiting.returncode == 0, waiting.stderr
    assert re.search(r"processed\s+0", waiting.stdout)
    line = waiting.stderr.strip().splitlines()[-1]
    found = re.fullmatch(
        rf"{queued} messages left on the queue, not due yet: the next in (\d+) s; a later "
        r"`batchrun retry`, or a `batchrun worker` left running, works them",
        line,
    )
    assert found, line
    assert 300 <= int(found.group(1)) <= 1200  # the backoff, with its jitter


def test_a_retry_stopped_by_max_says_some_are_due_now(
    env: dict[str, str], smtp_server: SmtpTestServer
) -> None:
    queued = _a_month_that_failed(env, smtp_server)

    done = run_cli("retry", "--max", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"{queued - 1} messages left on the queue, some due now; a later `batchrun retry`, "
        "or a `batchrun worker` left running, works them"
    )
    assert "left on the queue" not in run_cli("retry", env=env).stderr  # all done now


def test_messages_of_a_job_the_drain_does_not_know_get_their_own_line_only(
    env: dict[str, str], smtp_server: SmtpTestServer
) -> None:
    _a_month_that_failed(env, smtp_server)

    unknown = run_cli("retry", env={**env, "BATCHRUN_BUILTIN_JOBS": ""})
    assert unknown.returncode == 1
    assert "which this process does not know" in unknown.stderr
    assert "left on the queue, not due" not in unknown.stderr
    assert "some due now" not in unknown.stderr

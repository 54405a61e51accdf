"""batchrun.testing: test a job the way batchrun runs it, from plain pytest.

A harness runs one job with batchrun's own runtime (claims, ledger, retry queue,
suppression list, templates, circuit breaker) on a temporary database, with a mailbox
instead of a mail server::

    from batchrun.testing import Harness
    from renewal import RenewalReminder

    SCHEMA = '''
    CREATE TABLE account (id INTEGER PRIMARY KEY, contact TEXT, name TEXT,
                          renews_on TEXT, active INTEGER);
    INSERT INTO account VALUES (1, 'ann@example.com', 'Ann', '2025-06-08', 1);
    '''

    def test_reminds_each_account_once():
        with Harness(RenewalReminder, schema=SCHEMA) as h:
            assert h.run("2025-06-01").succeeded == 1
            (email,) = h.emails
            assert email.to == "ann@example.com" and "renews" in email.subject
            assert h.ledger(1, "2025-06-01").state == "succeeded"
            assert h.run("2025-06-01").eligible == 0  # exactly once

What is here:

    Harness, AsyncHarness   the job, its database and mailbox; run, dry_run, retry,
                            preview, ledger, status, page / prepare / process
    Mailbox, Email          the captured emails (to, subject, text, html, headers) and
                            injected failures: fail("temporary" | "permanent" | "outage")
    LedgerEntry             how one entity stands: state, attempts, reason
    HttpDouble, Request     a local HTTP server standing in for a job's backend
    Summary, RetrySummary   what runs and retries return
"""

from __future__ import annotations

from batchrun.pipeline.reports import RetrySummary, Summary
from batchrun.testing.harness import AsyncHarness, PeriodLike
from batchrun.testing.http import HttpDouble, Request
from batchrun.testing.ledger import LedgerEntry
from batchrun.testing.mailbox import Email, FailureKind, Headers, Mailbox
from batchrun.testing.sync import Harness

__all__ = [
    "AsyncHarness",
    "Email",
    "FailureKind",
    "Harness",
    "Headers",
    "HttpDouble",
    "LedgerEntry",
    "Mailbox",
    "PeriodLike",
    "Request",
    "RetrySummary",
    "Summary",
]

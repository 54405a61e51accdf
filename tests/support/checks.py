"""Assertions the tests repeat: what a month of the birthday job must look like.

Registered for pytest's assertion rewriting (conftest.py), so a failing check shows the
values it compared, as an inline ``assert`` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from batchrun.db.store import State
from support.birthday import card_codes, card_counts, codes_in_mail, grouped_code, ledger_states
from support.db import query
from support.smtp_server import SmtpTestServer


def assert_one_card_each(db_url: str, want: Iterable[int], *, year: int = 2025) -> None:
    """Each user in ``want`` holds exactly one of the job's cards for ``year``; nobody else
    holds one."""
    assert card_counts(db_url, year) == dict.fromkeys(want, 1)


def assert_one_card_and_one_email_each(
    db_url: str, server: SmtpTestServer, want: Iterable[int], *, year: int = 2025
) -> None:
    """Each user in ``want`` holds exactly one card for ``year`` and was sent exactly one
    email (every email the server accepted counts); nobody else got either."""
    want = list(want)
    assert card_counts(db_url, year) == dict.fromkeys(want, 1)
    assert server.sends_per_user() == Counter(dict.fromkeys(want, 1))


def assert_month_complete(
    db_url: str,
    server: SmtpTestServer,
    *,
    year: int,
    want: set[int],
    skipped: int,
    max_duplicates: int,
    where: str,
) -> int:
    """The invariants after a month completed; returns the duplicate emails seen."""
    assert card_counts(db_url, year) == dict.fromkeys(want, 1), f"one card each ({where})"
    per_user = server.sends_per_user(year)
    assert set(per_user) == want, (
        f"every eligible user emailed, nobody else ({where}): "
        f"missing {sorted(want - set(per_user))[:10]}, extra {sorted(set(per_user) - want)[:10]}"
    )
    duplicates = sum(n - 1 for n in per_user.values())
    assert duplicates <= max_duplicates, f"{duplicates} duplicates > {max_duplicates} ({where})"
    codes = card_codes(db_url, year)
    shown = codes_in_mail(server, year)
    wrong = {uid: got for uid, got in shown.items() if got != {grouped_code(codes[uid])}}
    assert not wrong, f"every email (duplicates too) shows the user's one card ({where}): {wrong}"
    states = ledger_states(db_url, year)
    expected = Counter({int(State.SUCCEEDED): len(want)})
    if skipped:
        expected[int(State.SKIPPED)] = skipped
    assert states == expected, f"ledger ({where})"
    held = query(
        db_url,
        "SELECT COUNT(*) FROM batchrun_ledger WHERE once_key = %s AND owner IS NOT NULL",
        str(year),
    )
    assert held == [(0,)], f"no claim left behind ({where})"
    return duplicates

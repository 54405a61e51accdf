"""The jobs the guarantee suite (test_every_job.py) runs: birthday, renewal and credits.

A ``JobCase`` knows one job's side of a guarantee test, so the test itself is written
once: how to seed entities of the job's schema on a migrated database, the CLI arguments
and environment that run it, how to make its effect fail for a while or for good, and how
to count its effects per entity (emails by their stable Message-ID, credit grants by their
Idempotency-Key). The ledger is read the same way for every job: that is batchrun's.

Import it as ``from support.job_cases import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import subprocess
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from batchrun.db import Store, connect
from batchrun.job import Job
from batchrun.mail.base import valid_address
from batchrun.registry import discover
from support import ROOT
from support.birthday import eligible_ids, seed_users
from support.cli import run_cli
from support.db import query
from support.http_server import GrantsTestServer
from support.smtp_server import SmtpTestServer

SENDER = "batchrun@example.com"
EXAMPLES = ROOT / "examples"
Failure = Literal["temporary", "permanent"]


@dataclass
class Entities:
    """What a seeded period must end with: who succeeds, who is skipped."""

    want: set[int]  # must end succeeded (state 1) with exactly one effect
    skip: set[int]  # selected by the page, then skipped by process (state 2), no effect
    address: dict[int, str] = field(default_factory=dict)  # email jobs: id -> recipient

    @property
    def selected(self) -> set[int]:
        return self.want | self.skip


class JobCase:
    """One job as the guarantee tests see it; bound to this test's servers."""

    name: ClassVar[str]
    period: ClassVar[str]  # the --period every test runs
    once: ClassVar[str]  # the once_per period of that --period: the ledger's once_key
    spec: ClassVar[str | None] = None  # --jobs (None: built in)
    reasons: ClassVar[dict[Failure, str]]  # what the ledger's reason says of each failure

    def __init__(self, smtp: SmtpTestServer, grants: GrantsTestServer) -> None:
        self.smtp = smtp
        self.grants = grants
        self.entities = Entities(set(), set())

    def __repr__(self) -> str:
        return self.name

    # -- running it -------------------------------------------------------------------------

    def env(self, db_url: str, **extra: str) -> dict[str, str]:
        """The environment of a batchrun process (or the Lambda) running this job."""
        env = {
            "PYTHONPATH": str(ROOT),
            "BATCHRUN_DB": db_url,
            "BATCHRUN_MAIL": self.smtp.url,
            "BATCHRUN_FROM": SENDER,
            "BATCHRUN_LEASE_S": "1",  # a killed run's claims expire within a second
            "BATCHRUN_RETRY_BASE_S": "0",  # a failed retry is visible again at once
            "BATCHRUN_BACKEND_CREDITS_URL": self.grants.url,
            "BATCHRUN_BACKEND_CREDITS_TIMEOUT_S": "5",
            "COLUMNS": "400",
            **extra,
        }
        if self.spec is not None:
            env["BATCHRUN_JOBS"] = str(ROOT / self.spec)
        return env

    def args(self, *args: str) -> list[str]:
        """``batchrun`` arguments: ``--jobs SPEC`` first, as a user would type it."""
        return (["--jobs", self.spec] if self.spec else []) + list(args)

    def cli(self, db_url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``python -m batchrun [--jobs SPEC] ARGS`` to its end."""
        return run_cli(*self.args(*args), env=self.env(db_url), timeout=timeout)

    def job(self) -> Job:
        """The job as ``--jobs`` registers it (its class loaded from its file)."""
        return discover([self.spec] if self.spec else []).get_job(self.name)

    # -- seeding ----------------------------------------------------------------------------

    def seed(self, db_url: str, n: int, *, seed: int = 1) -> Entities:
        """Migrate the database for every registered job, as ``db migrate`` does, and add
        about ``n`` entities of this job's period (and some the page must leave out)."""

        async def go() -> None:
            database = await connect(db_url, create=True)
            try:
                store = Store(database)
                registry = discover([self.spec] if self.spec else [])
                await store.migrate([entry.job for entry in registry.values()])
                await self._seed(store, n, random.Random(seed))
            finally:
                await database.close()

        asyncio.run(go())
        self.entities = self._entities(db_url)
        assert len(self.entities.want) >= n // 2, f"{self.name}: too few entities seeded"
        return self.entities

    async def _seed(self, store: Store, n: int, rng: random.Random) -> None:
        raise NotImplementedError

    def _entities(self, db_url: str) -> Entities:
        raise NotImplementedError

    # -- effects ----------------------------------------------------------------------------

    def slow_down(self, seconds: float) -> None:
        """Make every effect take ``seconds`` (so a kill or a deadline lands mid-run)."""
        raise NotImplementedError

    def effects(self) -> Counter[int]:
        """Effects per entity so far; asserts every one carries its entity's own key."""
        raise NotImplementedError

    def effect_count(self) -> int:
        """Effects so far (cheap: polled while a run goes on)."""
        raise NotImplementedError

    def inject(self, failure: Failure, rng: random.Random) -> None:
        """Make some of the effects fail, temporarily (retry) or permanently (fail)."""
        raise NotImplementedError

    def failed(self, failure: Failure) -> set[int]:
        """The entities whose effect the injected failure hit (read after the run)."""
        raise NotImplementedError

    def recover(self) -> None:
        """The effect's backend works again."""
        raise NotImplementedError

    def check_records(
        self, db_url: str, succeeded: AbstractSet[int], failed: AbstractSet[int]
    ) -> None:
        """The job's own records (cards, grants) agree with the ledger."""

    # -- the ledger -------------------------------------------------------------------------

    def ledger(self, db_url: str) -> dict[int, tuple[int, str | None]]:
        """entity id -> (state, owner) of this job's once_per period."""
        rows = query(
            db_url,
            "SELECT entity_id, state, owner FROM batchrun_ledger WHERE job = %s AND once_key = %s",
            self.name,
            self.once,
        )
        return {int(r[0]): (int(r[1]), r[2]) for r in rows}


class EmailCase(JobCase):
    """A job whose effect is one email per entity, through the SMTP test server."""

    TEMPORARY = "451 4.3.0 Try again later"
    PERMANENT = "550 5.1.1 No such user"
    reasons: ClassVar[dict[Failure, str]] = {"temporary": "451", "permanent": "550"}

    def __init__(self, smtp: SmtpTestServer, grants: GrantsTestServer) -> None:
        super().__init__(smtp, grants)
        self._failing: dict[Failure, set[int]] = {}

    def slow_down(self, seconds: float) -> None:
        self.smtp.set_latency(seconds)

    def effects(self) -> Counter[int]:
        prefix = f"{self.name}.{self.once}."
        counts: Counter[int] = Counter()
        for message in self.smtp.messages:
            assert message.message_id is not None, "a message without a Message-ID"
            local, _, domain = message.message_id.strip("<>").partition("@")
            assert local.startswith(prefix) and domain == "example.com", message.message_id
            uid = int(local.removeprefix(prefix))
            # The Message-ID is the entity's key: a duplicate carries the same one, and it
            # went to that entity's own address.
            assert message.recipients == [self.entities.address[uid]], (uid, message.recipients)
            counts[uid] += 1
        return counts

    def effect_count(self) -> int:
        return len(self.smtp.messages)

    def inject(self, failure: Failure, rng: random.Random) -> None:
        want = sorted(self.entities.want)
        if failure == "temporary":
            chosen = {uid for uid in want if rng.random() < 0.15} or {want[0]}
        else:
            chosen = set(rng.sample(want, 3))
        self._failing[failure] = chosen
        reply = self.TEMPORARY if failure == "temporary" else self.PERMANENT
        addresses = {self.entities.address[uid] for uid in chosen}
        self.smtp.set_policy(lambda rcpt, _n: reply if rcpt in addresses else None)

    def failed(self, failure: Failure) -> set[int]:
        return self._failing[failure]

    def recover(self) -> None:
        self.smtp.set_policy(None)


class BirthdayCase(EmailCase):
    """The built-in job: users born in June, a card for 2025 and an email each."""

    name = "birthday"
    period = "2025-06"
    once = "2025"

    async def _seed(self, store: Store, n: int, rng: random.Random) -> None:
        # About one user in twelve is born in June; a few are inactive, have no address
        # (left out by the page) or an invalid one (selected, then skipped).
        await seed_users(store, n * 12, seed=rng.randrange(1000))

    def _entities(self, db_url: str) -> Entities:
        selected = eligible_ids(db_url, 6)
        address = {
            int(uid): str(email)
            for uid, email in query(db_url, "SELECT id, email FROM user WHERE birth_month = 6")
            if int(uid) in selected
        }
        want = {uid for uid in selected if valid_address(address[uid])}
        return Entities(want, selected - want, address)

    def check_records(
        self, db_url: str, succeeded: AbstractSet[int], failed: AbstractSet[int]
    ) -> None:
        rows = query(
            db_url,
            "SELECT idempotency_key FROM gift_card WHERE idempotency_key LIKE %s",
            f"birthday:{self.once}:%",
        )
        cards = Counter(int(str(key).rsplit(":", 1)[1]) for (key,) in rows)
        assert all(n == 1 for n in cards.values()), "at most one card per user and year"
        # A card is made (prepare) before its email: a user whose email failed for good
        # keeps the card, one who was skipped never gets one.
        assert succeeded <= set(cards) <= succeeded | failed, "cards exactly for the emailed"


class RenewalCase(EmailCase):
    """examples/renewal: accounts renewing on 2025-06-08 get a reminder on 2025-06-01."""

    name = "renewal"
    period = "2025-06-01"
    once = "2025-06-01"
    spec = "examples/renewal/renewal.py"

    async def _seed(self, store: Store, n: int, rng: random.Random) -> None:
        renews = dt.date(2025, 6, 8)
        rows = []
        for i in range(1, n + n // 4 + 1):
            on_time = rng.random() < 0.8  # the others renew on another day: not selected
            day = renews if on_time else renews + dt.timedelta(days=rng.choice([-1, 1, 30]))
            active = 0 if rng.random() < 0.05 else 1  # inactive: not selected
            contact = None if rng.random() < 0.03 else f"acct{i}@example.com"  # skipped
            rows.append((contact, f"Account {i}", day.isoformat(), active))
        rng.shuffle(rows)  # ids do not follow the days
        await store.jobdb.execute(
            "INSERT INTO account (contact, name, renews_on, active) VALUES :rows", rows=rows
        )

    def _entities(self, db_url: str) -> Entities:
        rows = query(
            db_url,
            "SELECT id, contact FROM account WHERE renews_on = %s AND active = 1",
            "2025-06-08",
        )
        address = {int(uid): str(contact) for uid, contact in rows if contact}
        selected = {int(uid) for uid, _ in rows}
        return Entities(set(address), selected - set(address), address)


class CreditsCase(JobCase):
    """examples/credits: one grant per active customer and month through the HTTP API."""

    name = "credits"
    period = "2025-06"
    once = "2025-06"
    spec = "examples/credits/credits.py"
    # 500, not 503: a 503 (or 429) through the backend is busy, which the run waits out
    STATUS: ClassVar[dict[Failure, int]] = {"temporary": 500, "permanent": 400}
    reasons: ClassVar[dict[Failure, str]] = {"temporary": "500", "permanent": "400"}

    async def _seed(self, store: Store, n: int, rng: random.Random) -> None:
        rows = []
        for i in range(1, n + n // 10 + 1):
            roll = rng.random()
            plan = "legacy" if roll < 0.03 else rng.choice(["starter", "pro", "team"])
            rows.append((f"c{i}@example.com", plan, 0 if 0.03 <= roll < 0.1 else 1))
        await store.jobdb.execute(
            "INSERT INTO customer (email, plan, active) VALUES :rows", rows=rows
        )

    def _entities(self, db_url: str) -> Entities:
        rows = query(db_url, "SELECT id, plan FROM customer WHERE active = 1")
        selected = {int(uid) for uid, _ in rows}
        legacy = {int(uid) for uid, plan in rows if plan == "legacy"}  # no credit: skipped
        return Entities(selected - legacy, legacy)

    def slow_down(self, seconds: float) -> None:
        self.grants.delay(seconds)

    def _key_of(self, call: Any) -> int:
        """The customer a call was for, checked against the Idempotency-Key it carried."""
        uid = int(call.body["customer_id"])
        assert call.key == f"credits:{self.once}:{uid}", f"call for {uid} with key {call.key!r}"
        return uid

    def effects(self) -> Counter[int]:
        return Counter(self._key_of(c) for c in self.grants.calls() if c.grant_id is not None)

    def effect_count(self) -> int:
        return len(self.grants.calls())

    def inject(self, failure: Failure, rng: random.Random) -> None:
        share = 0.15 if failure == "temporary" else 0.05
        self.grants.answer_fraction(share, self.STATUS[failure], seed=rng.randrange(1000))

    def failed(self, failure: Failure) -> set[int]:
        status = self.STATUS[failure]
        return {self._key_of(c) for c in self.grants.calls() if c.status == status}

    def recover(self) -> None:
        self.grants.answer_fraction(0, 500)

    def check_records(
        self, db_url: str, succeeded: AbstractSet[int], failed: AbstractSet[int]
    ) -> None:
        rows = query(
            db_url,
            "SELECT idempotency_key, customer_id FROM credit_grant WHERE idempotency_key LIKE %s",
            f"credits:{self.once}:%",
        )
        assert all(key == f"credits:{self.once}:{uid}" for key, uid in rows)
        recorded = Counter(int(uid) for _, uid in rows)
        assert recorded == Counter(dict.fromkeys(succeeded, 1)), "one credit_grant row each"


CASES: dict[str, type[JobCase]] = {
    case.name: case for case in (BirthdayCase, RenewalCase, CreditsCase)
}

__all__ = ["CASES", "SENDER", "Entities", "Failure", "JobCase"]

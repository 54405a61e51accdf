"""One address key everywhere: rows a suppression list stored before the
key took its present form (local part as given, Unicode domain lower-cased) still match
after `db migrate`, which rewrites them once (step migrate_0040_suppression_keys)."""

from __future__ import annotations

import pytest
from support.db import query

from batchrun.db import Store
from batchrun.errors import NotMigratedError
from batchrun.mail.address import address_key

STEP = "migrate_0040_suppression_keys"
# (stored by batchrun before this step, reason, source, created_at)
LEGACY = [
    ("Jo@bücher.example", "unsubscribe", "birthday", 1000),
    ("Ann@example.com", "manual", "cli", 2000),
    ("ZOË@x.org", "complaint", "ses-1", 3000),
    # two rows that are one address now: the one already under the key stays
    ("Bob@example.com", "manual", "cli", 4000),
    ("bob@example.com", "bounce", "ses-2", 5000),
    ("already@example.com", "bounce", "ses-3", 6000),
]


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("Jo@Bücher.Example", "jo@xn--bcher-kva.example"),
        ("jo@XN--BCHER-KVA.example", "jo@xn--bcher-kva.example"),
        ("JO@BÜCHER.EXAMPLE", "jo@xn--bcher-kva.example"),
        ("Zoe\u0308@x.org", "zoë@x.org"),  # decomposed: NFC
        ("STRASSE@x.org", "strasse@x.org"),
        ("Straße@x.org", "strasse@x.org"),  # case-folded, not just lower-cased
        ("a@b.c", "a@b.c"),
        ("no-at-sign", "no-at-sign"),
    ],
)
def test_every_form_of_an_address_has_one_key(address: str, key: str) -> None:
    assert address_key(address) == key
    assert address_key(key) == key  # a key is its own key


async def test_rows_stored_before_are_rekeyed_once_by_migrate(store: Store, db_url: str) -> None:
    for address, reason, source, created in LEGACY:
        query(
            db_url,
            "INSERT INTO batchrun_suppression (address, reason, source, created_at) "
            "VALUES (%s, %s, %s, %s)",
            address,
            reason,
            source,
            created,
        )
    # A database migrated by the code before this step: the step is not recorded.
    query(db_url, "DELETE FROM batchrun_schema WHERE step = %s", STEP)
    with pytest.raises(NotMigratedError, match=STEP):
        await store.check_migrated()

    assert await store.migrate() == [STEP]
    rows = {
        r[0]: tuple(r[1:])
        for r in query(
            db_url, "SELECT address, reason, source, created_at FROM batchrun_suppression"
        )
    }
    assert rows == {
        "jo@xn--bcher-kva.example": ("unsubscribe", "birthday", 1000),
        "ann@example.com": ("manual", "cli", 2000),
        "zoë@x.org": ("complaint", "ses-1", 3000),
        "bob@example.com": ("bounce", "ses-2", 5000),
        "already@example.com": ("bounce", "ses-3", 6000),
    }
    found = await store.suppressed(["jo@bücher.example", "ANN@Example.com", "Zoë@X.org"])
    assert found == {
        "jo@bücher.example": "unsubscribe",
        "ANN@Example.com": "manual",
        "Zoë@X.org": "complaint",
    }
    assert await store.migrate() == []  # recorded: a second migrate changes nothing
    assert await store.rekey_suppressions() == 0  # and the step itself is idempotent
    await store.check_migrated()

"""The suppression list (``batchrun_suppression``): addresses no job may mail, each with
its reason (unsubscribe, bounce, complaint, manual), keyed in one normalised form
(``address_key``: IDNA A-label domain, NFC, case-folded). Mixed into ``Store``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from batchrun.chunks import chunks
from batchrun.db.base import Row
from batchrun.db.clock import server_clock
from batchrun.mail.address import address_key

if TYPE_CHECKING:
    from batchrun.db.base import Database

Reason = Literal["unsubscribe", "bounce", "complaint", "manual"]
REASONS: tuple[Reason, ...] = get_args(Reason)
MAX_ADDRESS_CHARS = 254
MAX_SOURCE_CHARS = 100
_LOOKUP_CHUNK = 1000  # addresses per IN list: well under every driver's parameter limit


def storable_key(key: str) -> bool:
    """Whether an address key can be stored and looked up: 1 to 254 characters, none of
    them a NUL or a lone surrogate (which no database column takes)."""
    if not 0 < len(key) <= MAX_ADDRESS_CHARS or "\x00" in key:
        return False
    if key.isascii():
        return True
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Suppression:
    """One address no job may mail: why, where that came from, since when (epoch ms)."""

    address: str  # the normalised key (address_key)
    reason: str
    source: str
    created_at: int


class SuppressionList:
    """The suppression list's operations over ``self.db``."""

    if TYPE_CHECKING:
        db: Database

    async def suppress(self, address: str, *, reason: Reason, source: str = "") -> bool:
        """Put ``address`` on the suppression list; whether it was not on it already (an
        address already there keeps its first reason and source)."""
        if reason not in REASONS:
            raise ValueError(f"suppression reason must be one of {', '.join(REASONS)}")
        key = address_key(address)
        if not storable_key(key):
            raise ValueError(f"not an address to suppress: {address[:80]!r}")
        changed = await self.db.execute(
            "suppression_add",
            address=key,
            reason=reason,
            source=source[:MAX_SOURCE_CHARS],
            now=await server_clock(self.db).now_ms(),
        )
        return changed > 0

    async def unsuppress(self, address: str) -> bool:
        """Take ``address`` off the suppression list; whether it was on it."""
        key = address_key(address)
        if not storable_key(key):
            return False
        return await self.db.execute("suppression_remove", address=key) > 0

    async def suppression(self, address: str) -> Suppression | None:
        """The suppression list's entry for ``address``, if any."""
        key = address_key(address)
        if not storable_key(key):
            return None
        row = await self.db.fetchone("suppression_get", address=key)
        return _suppression(row) if row is not None else None

    async def suppressed(self, addresses: Iterable[str]) -> dict[str, str]:
        """The suppressed ones among ``addresses`` (as given), each with its reason: one
        query per thousand addresses."""
        by_key: dict[str, list[str]] = {}
        for address in addresses:
            by_key.setdefault(address_key(address), []).append(address)
        keys = [k for k in by_key if storable_key(k)]
        found: dict[str, str] = {}
        for chunk in chunks(keys, _LOOKUP_CHUNK):
            for key, reason in await self.db.fetchall("suppression_of", addresses=chunk):
                for address in by_key.get(str(key), ()):
                    found[address] = str(reason)
        return found

    async def suppressions(self, *, after: str = "", limit: int = 1000) -> list[Suppression]:
        """A page of the suppression list in address order, addresses above ``after``."""
        rows = await self.db.fetchall("suppression_page", after=after, limit=limit)
        return [_suppression(r) for r in rows]

    async def rekey_suppressions(self) -> int:
        """Rewrite every stored address whose key is not ``address_key`` of itself (rows
        stored before the key took its present form); how many were rewritten.

        Idempotent and safe to interrupt: the row goes in under its new key (kept as it
        is when one is there already) before the old one goes, a page at a time.
        """
        rewritten = 0
        after = ""
        while True:
            rows = await self.db.fetchall("suppression_page", after=after, limit=_LOOKUP_CHUNK)
            for row in rows:
                entry = _suppression(row)
                key = address_key(entry.address)
                if key == entry.address or not storable_key(key):
                    continue
                await self.db.execute(
                    "suppression_add",
                    address=key,
                    reason=entry.reason,
                    source=entry.source,
                    now=entry.created_at,
                )
                await self.db.execute("suppression_remove", address=entry.address)
                rewritten += 1
            if len(rows) < _LOOKUP_CHUNK:
                return rewritten
            after = str(rows[-1][0])


def _suppression(row: Row) -> Suppression:
    return Suppression(str(row[0]), str(row[1]), str(row[2]), int(row[3]))

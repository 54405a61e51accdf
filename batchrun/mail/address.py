"""International addresses: domains go out in IDNA (``bücher.example`` ->
``xn--bcher-kva.example``); a non-ASCII local part needs SMTPUTF8 (RFC 6531) end to end.

The domain is mapped as browsers and mail clients map it (UTS #46, non-transitional: case
folded, ``ß`` kept, full-width dots become dots), then each non-ASCII label is encoded as
an IDNA 2008 A-label. ASCII labels are left as they are, so a domain valid before IDNA
(an underscore in a label, say) stays valid.

``address_key`` is the one form an address is compared in (the suppression list, SES
events, unsubscribe tokens): the domain as its A-labels, everything NFC and case-folded,
so ``Jo@Bücher.example``, ``jo@xn--bcher-kva.example`` and ``JO@BÜCHER.EXAMPLE`` are one
address.
"""

from __future__ import annotations

import functools
import unicodedata


class AddressError(ValueError):
    """An address that cannot be written on the wire as it is."""


def needs_smtputf8(addr: str) -> bool:
    """Whether ``addr`` has a non-ASCII local part (which only SMTPUTF8 can carry)."""
    return not addr.isascii() and not addr.rpartition("@")[0].isascii()


def wire_address(addr: str) -> str:
    """``addr`` with its domain in IDNA: what goes in RCPT TO and in the To header.

    A plain ASCII address comes back unchanged (the common case costs one check); the
    local part is never changed.

    Raises:
        AddressError: the domain cannot be written in IDNA (a disallowed character such
            as an emoji, a label too long, a hyphen at either end ...).
    """
    if addr.isascii():
        return addr
    local, at, domain = addr.rpartition("@")
    if not at:
        raise AddressError(f"no @ in address {addr!r}")
    ascii_domain = idna_domain(domain)
    if ascii_domain is None:
        raise AddressError(f"domain {domain!r} cannot be written in IDNA")
    return f"{local}@{ascii_domain}"


@functools.lru_cache(maxsize=1024)
def idna_domain(domain: str) -> str | None:
    """``domain`` as DNS writes it (A-labels), or None if IDNA cannot encode it.

    Cached: a list's domains repeat, and one encoding costs about 45 µs.
    """
    if domain.isascii():
        return domain
    import idna  # here, not at the top: ~50 ms of start-up that ASCII-only lists never need

    try:
        mapped = idna.uts46_remap(domain, std3_rules=False, transitional=False)
        labels = [
            label if label.isascii() else idna.alabel(label).decode("ascii")
            for label in mapped.split(".")
        ]
    except (idna.IDNAError, UnicodeError):
        return None
    return ".".join(labels)


def address_key(address: str) -> str:
    """The one form ``address`` is compared and stored in: the domain in IDNA A-labels,
    the whole address NFC and case-folded (``Jo@Bücher.example`` ->
    ``jo@xn--bcher-kva.example``).

    Case-folding the local part too: RFC 5321 leaves its case to the receiving server,
    but no mailbox provider tells ``Jo`` from ``jo``, and a bounce reported as ``JO@...``
    must stop the mail to ``jo@...``. An ASCII address costs one ``lower()``. A domain
    IDNA cannot encode (it can never be mailed) keeps its NFC, case-folded text.
    """
    if address.isascii():
        return address.lower()
    local, at, domain = address.rpartition("@")
    if not at:
        return _folded(address)
    wire = idna_domain(domain)
    return f"{_folded(local)}@{_folded(domain) if wire is None else wire.lower()}"


def _folded(text: str) -> str:
    # casefold can undo NFC ("İ" folds to "i" + a combining dot): normalise on both sides.
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())

"""DKIM signing (RFC 6376) with dkimpy, for SMTP relays that do not sign.

``BATCHRUN_DKIM_KEY_FILE`` (a PEM RSA private key) and ``BATCHRUN_DKIM_SELECTOR`` turn it
on: every message sent through ``smtp://`` / ``smtps://`` is signed for the domain of
``--from``, and so is every ``file://`` outbox file (the outbox shows what a relay would
receive, signature included, so a key and its DNS record can be checked before a real
run). SES signs with Easy DKIM: a second signature there would only be a second thing to
keep valid, so ``ses://`` is never signed; ``console://`` and ``discard://`` neither.

The signed fields are the ones batchrun writes, ``List-Unsubscribe-Post`` among them
(dkimpy's default list leaves it out, and RFC 8058 asks for both list fields to be
covered); a field absent from a message is still named in ``h=``, so a relay cannot add
it later without breaking the signature. ``From`` is named twice for the same reason.
"""

from __future__ import annotations

import logging
from email.utils import parseaddr
from pathlib import Path
from typing import Any

from batchrun import schemes
from batchrun.errors import ConfigError
from batchrun.mail.address import idna_domain
from batchrun.settings import Settings

log = logging.getLogger(__name__)

SIGNED_HEADERS = (
    "from",
    "to",
    "subject",
    "date",
    "message-id",
    "x-batchrun-id",
    "auto-submitted",
    "list-unsubscribe",
    "list-unsubscribe-post",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
    "from",  # over-signed: a second From added on the way breaks the signature
)
MIN_KEY_BITS = 1024  # what receivers (and dkimpy's verify) accept; 2048 is recommended
MAX_KEY_FILE_BYTES = 64 * 1024


class DkimSigner:
    """Adds a DKIM-Signature to a message's bytes; one per run, shared by every send."""

    def __init__(self, key: bytes, selector: str, domain: str, *, openssl: bool = True) -> None:
        """Check the key can sign, by signing a probe message once.

        Args:
            key: a PEM RSA private key (PKCS#1 or PKCS#8, unencrypted).
            selector: the DNS selector (the TXT record is ``SELECTOR._domainkey.DOMAIN``).
            domain: the signing domain (``d=``), in IDNA.
            openssl: do dkimpy's RSA step with OpenSSL (``cryptography``) when it is
                installed: the same bytes (PKCS#1 v1.5 signatures are deterministic),
                ~20x faster than dkimpy's pure-Python RSA (bench/dkim_cost.py).

        Raises:
            ValueError: the key is not a usable RSA private key (the message never holds
                the key itself).
        """
        import dkim  # dkimpy; imported here so a run that does not sign never loads it

        self._dkim: Any = dkim
        # dkimpy finds the PEM body between "--\n" and "\n--": CRLF files must not hide it.
        self._key = key.replace(b"\r\n", b"\n")
        self.selector = selector
        self.domain = domain
        self._selector = selector.encode("ascii")
        self._domain = domain.encode("ascii")
        self._headers = [name.encode("ascii") for name in SIGNED_HEADERS]
        try:
            parsed = dkim.crypto.parse_pem_private_key(self._key)
        except (dkim.crypto.UnparsableKeyError, ValueError, IndexError, TypeError) as exc:
            raise ValueError(f"not a PEM RSA private key ({_first_line(exc)})") from None
        self._parsed = parsed
        bits = int(parsed["modulus"]).bit_length()
        if bits < MIN_KEY_BITS:
            raise ValueError(f"a {bits}-bit RSA key is too short (at least {MIN_KEY_BITS})")
        self.key_bits = bits
        self._openssl = _openssl_key(self._key) if openssl else None
        self.sign(_PROBE)  # any other failure of the key shows now, not at the first send

    @property
    def uses_openssl(self) -> bool:
        """Whether the RSA step runs in OpenSSL (``cryptography``) rather than dkimpy's Python."""
        return self._openssl is not None

    def __repr__(self) -> str:
        return f"DkimSigner(d={self.domain}, s={self.selector}, {self.key_bits}-bit RSA)"

    def sign(self, raw: bytes) -> bytes:
        """``raw`` with a ``DKIM-Signature`` field in front (rsa-sha256, relaxed/simple).

        Raises ValueError for a message dkimpy cannot sign (it never holds the key).
        """
        dkim = self._dkim
        pure, parse = dkim.RSASSA_PKCS1_v1_5_sign, dkim.parse_pem_private_key
        if self._openssl is not None:
            # dkimpy has no hook for its RSA step, and parses the PEM key (in pure Python,
            # ~1 ms) on every call: swap both functions it calls for the length of this
            # (synchronous) call only.
            dkim.RSASSA_PKCS1_v1_5_sign = self._openssl_sign
            dkim.parse_pem_private_key = self._parsed_key
        try:
            field: bytes = dkim.sign(
                raw,
                self._selector,
                self._domain,
                self._key,
                include_headers=self._headers,
            )
        except dkim.DKIMException as exc:
            raise ValueError(f"DKIM signing failed: {_first_line(exc)}") from None
        finally:
            dkim.RSASSA_PKCS1_v1_5_sign, dkim.parse_pem_private_key = pure, parse
        return field + raw

    def _parsed_key(self, _pem: bytes) -> Any:
        """dkimpy's ``parse_pem_private_key``, answered once: the key never changes."""
        return self._parsed

    def _openssl_sign(self, digest: Any, _parsed_key: Any) -> bytes:
        """dkimpy's ``RSASSA_PKCS1_v1_5_sign(hash, key)``, done by OpenSSL."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding, utils

        assert self._openssl is not None
        algorithm = hashes.SHA256() if digest.name == "sha256" else hashes.SHA1()  # noqa: S303
        signature: bytes = self._openssl.sign(
            digest.digest(), padding.PKCS1v15(), utils.Prehashed(algorithm)
        )
        return signature


def signer_for(settings: Settings, sender: str | None = None) -> DkimSigner | None:
    """The signer the settings ask for, for the mail backend they name (None: no signing).

    Its domain is ``--from``'s, else ``sender``'s (the job's own From).

    Raises:
        ConfigError: the key file cannot be read or holds no usable RSA private key, or
            dkimpy is not installed. One line, naming the file, never its contents.
    """
    path, selector = settings.dkim_key_file, settings.dkim_selector
    if path is None or selector is None:
        return None
    if not schemes.can(settings.mail_url, "dkim"):
        if schemes.can(settings.mail_url, "self_signs"):
            log.info(
                "%s:// signs itself (SES: Easy DKIM): BATCHRUN_DKIM_KEY_FILE is not used",
                schemes.scheme_of(settings.mail_url),
            )
        return None
    sender = settings.sender or sender
    if sender is None:
        raise ConfigError("DKIM needs --from (BATCHRUN_FROM): its domain is the signing domain")
    address = parseaddr(sender)[1] or sender
    domain = idna_domain(address.rpartition("@")[2].lower())
    if not domain:
        raise ConfigError(f"DKIM needs a domain in --from, got {sender!r}")
    try:
        with Path(path).open("rb") as file:
            key = file.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"BATCHRUN_DKIM_KEY_FILE {path}: cannot read it ({exc.strerror or exc})"
        ) from None
    if len(key) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"BATCHRUN_DKIM_KEY_FILE {path}: too large for a private key")
    try:
        return DkimSigner(key, selector, domain)
    except ImportError as exc:
        raise ConfigError(
            f"DKIM signing needs dkimpy (pip install 'batchrun[dkim]'): {exc}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"BATCHRUN_DKIM_KEY_FILE {path}: {exc}") from None


def _openssl_key(pem: bytes) -> Any:
    """The key as a ``cryptography`` RSA key, or None without cryptography (or for a key
    it reads differently: dkimpy's own RSA then signs)."""
    try:
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
    except ImportError:
        return None
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None
    return key if isinstance(key, rsa.RSAPrivateKey) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


_PROBE = b"From: probe@example.com\r\nTo: probe@example.com\r\nSubject: probe\r\n\r\nprobe\r\n"

"""DKIM: messages signed with a test key verify with dkimpy against that key (a DNS stub),
the signature covers both list fields, tampering breaks it; SES is never signed; a bad
key stops a run before anything is sent, with one line and exit 2."""

from __future__ import annotations

import base64
import email
import email.policy
import random
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from support.cli import run_cli
from support.smtp_server import SmtpTestServer

from batchrun import unsubscribe
from batchrun.errors import ConfigError
from batchrun.mail.base import Message, from_url
from batchrun.mail.dkim import DkimSigner, signer_for
from batchrun.mail.file import FileMailer
from batchrun.mail.smtp import SmtpMailer
from batchrun.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SENDER = "Birthday Team <birthday@example.com>"
SELECTOR = "mail2026"
UNSUBSCRIBE = "https://example.com/u/TOKEN123"


def _pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, fmt: str = "pkcs8") -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8
        if fmt == "pkcs8"
        else serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def key_file(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> Path:
    path = tmp_path / "dkim.pem"
    path.write_bytes(_pem(rsa_key))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def dns(rsa_key: rsa.RSAPrivateKey) -> Callable[..., bytes | None]:
    """A DNS stub answering SELECTOR._domainkey.example.com with the test key's record."""
    public = rsa_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    record = b"v=DKIM1; k=rsa; p=" + base64.b64encode(public)
    asked: list[bytes] = []

    def lookup(name: bytes, timeout: float = 5) -> bytes | None:
        asked.append(name)
        return record if name == f"{SELECTOR}._domainkey.example.com.".encode() else None

    lookup.asked = asked  # type: ignore[attr-defined]
    return lookup


def message(n: int = 1, to_addr: str = "ada@example.org") -> Message:
    return Message(
        sender=SENDER,
        to_addr=to_addr,
        to_name="Ada Lovelace",
        subject="Happy birthday, Ada",
        text="Happy birthday!\n\nYour gift code: ABCD-EFGH-JKMN-PQRS\n",
        html="<p>Happy birthday!</p><p>Your gift code: <b>ABCD-EFGH-JKMN-PQRS</b></p>",
        message_id=f"<birthday.2025.{n}@example.com>",
        headers=unsubscribe.headers(UNSUBSCRIBE),
    )


def tags(raw: bytes) -> dict[str, str]:
    """The tags of the first DKIM-Signature of ``raw``, unfolded."""
    parsed = email.message_from_bytes(raw, policy=email.policy.compat32)
    value = re.sub(r"\s+", "", str(parsed["DKIM-Signature"]))
    return dict(part.split("=", 1) for part in value.split(";") if part)


def signer(key_file: Path, sender: str = SENDER, mail_url: str = "smtp://relay") -> DkimSigner:
    settings = Settings(
        sender=sender, mail_url=mail_url, dkim_key_file=str(key_file), dkim_selector=SELECTOR
    )
    made = signer_for(settings)
    assert made is not None
    return made


# -- signing -------------------------------------------------------------------------------


def test_a_signed_message_verifies_and_covers_both_list_fields(
    key_file: Path, dns: Callable[..., bytes | None]
) -> None:
    signed = signer(key_file).sign(message().to_bytes())
    assert signed.startswith(b"DKIM-Signature: ")
    assert dkim.verify(signed, dnsfunc=dns)
    sig = tags(signed)
    assert (sig["d"], sig["s"], sig["a"]) == ("example.com", SELECTOR, "rsa-sha256")
    signed_fields = sig["h"].lower().split(":")
    # dkimpy's default list leaves List-Unsubscribe-Post out: RFC 8058 wants both signed.
    assert {"list-unsubscribe", "list-unsubscribe-post"} <= set(signed_fields)
    assert {"from", "to", "subject", "date", "message-id", "content-type"} <= set(signed_fields)
    assert signed_fields.count("from") == 2, "From is over-signed: a second one breaks it"


def test_folded_headers_sign_and_verify(key_file: Path, dns: Callable[..., bytes | None]) -> None:
    """A 1,225-byte ASCII subject and a long plain name are folded;
    the signature covers the folded fields and still verifies."""
    subject = " ".join(f"word{n:03d}" for n in range(160))[:1225]
    long = replace(message(), subject=subject, to_name=" ".join(["Bartholomew"] * 16))
    raw = long.to_bytes()
    assert max(len(line) for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n")) <= 78
    signed = signer(key_file).sign(raw)
    assert dkim.verify(signed, dnsfunc=dns)
    assert not dkim.verify(signed.replace(b"word100", b"word101"), dnsfunc=dns)


@pytest.mark.parametrize(
    ("what", "tamper"),
    [
        ("body", lambda raw: raw.replace(b"\r\n\r\n", b"\r\n\r\nX", 1)[:-8] + raw[-8:]),
        ("a body byte", lambda raw: raw[:-6] + bytes([raw[-6] ^ 1]) + raw[-5:]),
        (
            "List-Unsubscribe-Post",
            lambda raw: raw.replace(b"List-Unsubscribe=One-Click", b"List-Unsubscribe=Two-Click"),
        ),
        ("List-Unsubscribe", lambda raw: raw.replace(b"TOKEN123", b"TOKEN124")),
        ("Subject", lambda raw: raw.replace(b"Subject: Happy", b"Subject: Hoppy")),
        (
            "a second From",
            lambda raw: raw.replace(b"\r\nTo: ", b"\r\nFrom: evil@attacker.example\r\nTo: ", 1),
        ),
        (
            "an added List-Unsubscribe-Post",
            lambda raw: raw.replace(
                b"\r\nMIME-Version", b"\r\nList-Unsubscribe-Post: x\r\nMIME-Version", 1
            ),
        ),
    ],
)
def test_tampering_breaks_the_signature(
    key_file: Path,
    dns: Callable[..., bytes | None],
    what: str,
    tamper: Callable[[bytes], bytes],
) -> None:
    signed = signer(key_file).sign(message().to_bytes())
    changed = tamper(signed)
    assert changed != signed, what
    assert not dkim.verify(changed, dnsfunc=dns), what


def test_a_pkcs1_key_with_crlf_lines_signs_too(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, dns: Callable[..., bytes | None]
) -> None:
    path = tmp_path / "dkim-pkcs1.pem"
    path.write_bytes(_pem(rsa_key, "pkcs1").replace(b"\n", b"\r\n"))
    assert dkim.verify(signer(path).sign(message().to_bytes()), dnsfunc=dns)


def test_the_domain_is_the_senders_in_idna() -> None:
    settings = Settings(sender="b@Example.COM", dkim_key_file="/nonexistent", dkim_selector="s")
    with pytest.raises(ConfigError, match="/nonexistent"):
        signer_for(settings)  # SMTP-side: read (and refused) at once
    # SES signs with Easy DKIM, console/discard send nothing: the key is not even read.
    for url in ("ses://eu-west-1", "console://", "discard://"):
        assert signer_for(settings.with_overrides(mail_url=url)) is None


def test_openssl_signs_the_very_bytes_dkimpy_would(
    key_file: Path, dns: Callable[..., bytes | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # PKCS#1 v1.5 signatures are deterministic: OpenSSL's RSA step (what batchrun uses when
    # cryptography is installed, ~20x faster) must give dkimpy's own result, byte for byte.
    fast = signer(key_file)
    pure = DkimSigner(key_file.read_bytes(), fast.selector, fast.domain, openssl=False)
    assert fast.uses_openssl and not pure.uses_openssl
    monkeypatch.setattr(dkim.time, "time", lambda: 1_750_000_000.0)  # the same t= tag
    for n in range(3):
        raw = message(n).to_bytes()
        signed = fast.sign(raw)
        assert signed == pure.sign(raw)
        assert dkim.verify(signed, dnsfunc=dns)
    # dkimpy's own functions are back in place once each call returns.
    assert dkim.RSASSA_PKCS1_v1_5_sign is dkim.crypto.RSASSA_PKCS1_v1_5_sign
    assert dkim.parse_pem_private_key is dkim.crypto.parse_pem_private_key


# -- through the backends ----------------------------------------------------------------------


@pytest.fixture
async def smtp_mailer(smtp_server: SmtpTestServer, key_file: Path) -> AsyncIterator[SmtpMailer]:
    mailer = from_url(smtp_server.url, timeout=5, dkim=signer(key_file))
    assert isinstance(mailer, SmtpMailer)
    yield mailer
    await mailer.close()


async def test_what_the_smtp_server_receives_verifies(
    smtp_server: SmtpTestServer, smtp_mailer: SmtpMailer, dns: Callable[..., bytes | None]
) -> None:
    await smtp_mailer.send(message(1))
    await smtp_mailer.send(message(2, to_addr="zoe@bücher.example"))  # an IDN domain
    for received in smtp_server.wait_for_messages(2):
        assert dkim.verify(received.raw, dnsfunc=dns), received.message_id
    assert smtp_server.messages[1].recipients == ["zoe@xn--bcher-kva.example"]


async def test_the_file_outbox_is_signed_too(
    tmp_path: Path, key_file: Path, dns: Callable[..., bytes | None]
) -> None:
    mailer = from_url(f"file://{tmp_path / 'outbox'}", dkim=signer(key_file))
    assert isinstance(mailer, FileMailer)
    msg = message()
    await mailer.send(msg)
    assert dkim.verify(mailer.path_for(msg).read_bytes(), dnsfunc=dns)


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"BATCHRUN_DKIM_KEY_FILE": "/k.pem"}, "needs BATCHRUN_DKIM_SELECTOR too"),
        ({"BATCHRUN_DKIM_SELECTOR": "s1"}, "needs BATCHRUN_DKIM_KEY_FILE too"),
        (
            {"BATCHRUN_DKIM_KEY_FILE": "/k.pem", "BATCHRUN_DKIM_SELECTOR": "bad selector"},
            "BATCHRUN_DKIM_SELECTOR must be a DNS label",
        ),
        (
            {"BATCHRUN_DKIM_KEY_FILE": "/k.pem", "BATCHRUN_DKIM_SELECTOR": "-s"},
            "BATCHRUN_DKIM_SELECTOR must be a DNS label",
        ),
    ],
)
def test_half_a_dkim_setting_is_a_config_error(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        Settings.from_env(env)


def test_a_selector_may_have_several_labels() -> None:
    settings = Settings.from_env(
        {"BATCHRUN_DKIM_KEY_FILE": "/k.pem", "BATCHRUN_DKIM_SELECTOR": "s2026.eu_west"}
    )
    assert (settings.dkim_key_file, settings.dkim_selector) == ("/k.pem", "s2026.eu_west")


def _short_key() -> rsa.RSAPrivateKey:
    """A 511-bit RSA key (cryptography will not generate one under 1024 bits)."""

    def prime(rng: random.Random) -> int:
        while True:
            n = rng.getrandbits(256) | 1 << 255 | 1
            if all(pow(a, n - 1, n) == 1 for a in (2, 3, 5, 7, 11, 13)):
                return n

    rng = random.Random(1)
    p, q, e = prime(rng), prime(rng), 65537
    d = pow(e, -1, (p - 1) * (q - 1))
    public = rsa.RSAPublicNumbers(e, p * q)
    numbers = rsa.RSAPrivateNumbers(p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p), public)
    return numbers.private_key()


def _bad_keys(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    short = _short_key()
    cases = {
        "missing": (tmp_path / "missing.pem", "cannot read it"),
        "garbage": (tmp_path / "garbage.pem", "not a PEM RSA private key"),
        "public key": (tmp_path / "public.pem", "not a PEM RSA private key"),
        "EC key": (tmp_path / "ec.pem", "not a PEM RSA private key"),
        "511-bit": (tmp_path / "short.pem", "511-bit RSA key is too short"),
        "directory": (tmp_path, "cannot read it"),
    }
    cases["garbage"][0].write_text("hello\n")
    cases["public key"][0].write_bytes(
        short.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    cases["EC key"][0].write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    cases["511-bit"][0].write_bytes(_pem(short))
    return cases


def test_a_bad_key_file_is_one_line_naming_the_file_never_its_contents(tmp_path: Path) -> None:
    for what, (path, expected) in _bad_keys(tmp_path).items():
        with pytest.raises(ConfigError) as info:
            signer(path)
        text = str(info.value)
        assert expected in text, (what, text)
        assert str(path) in text and "\n" not in text, (what, text)
        assert "PRIVATE KEY" not in text and "MII" not in text, (what, text)


def test_a_run_with_a_bad_key_stops_before_anything_with_exit_2(
    tmp_path: Path, smtp_server: SmtpTestServer
) -> None:
    db = f"sqlite:///{tmp_path / 'b.db'}"
    env = {
        "PYTHONPATH": str(ROOT),
        "BATCHRUN_DB": db,
        "BATCHRUN_MAIL": smtp_server.url,
        "BATCHRUN_FROM": SENDER,
        "COLUMNS": "400",
    }
    # Not even migrated: the key is read and tried before the database is opened.
    bad = tmp_path / "garbage.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    dkim_env = env | {"BATCHRUN_DKIM_KEY_FILE": str(bad), "BATCHRUN_DKIM_SELECTOR": SELECTOR}
    run = run_cli("birthday", "--month", "2025-06", "--json", env=dkim_env)
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(bad) in lines[0], run.stderr
    assert smtp_server.messages == [] and smtp_server.connections_opened == 0


def test_a_run_signs_every_message_of_the_outbox(
    tmp_path: Path, key_file: Path, dns: Callable[..., bytes | None]
) -> None:
    outbox = tmp_path / "outbox"
    env = {
        "PYTHONPATH": str(ROOT),
        "BATCHRUN_DB": f"sqlite:///{tmp_path / 'b.db'}",
        "BATCHRUN_MAIL": f"file://{outbox}",
        "BATCHRUN_FROM": SENDER,
        "BATCHRUN_UNSUBSCRIBE_URL": "https://example.com/u",
        "BATCHRUN_UNSUBSCRIBE_SECRET": "s" * 32,
        "BATCHRUN_DKIM_KEY_FILE": str(key_file),
        "BATCHRUN_DKIM_SELECTOR": SELECTOR,
    }
    assert run_cli("db", "migrate", env=env).returncode == 0
    assert run_cli("db", "seed", "--users", "100", "--seed", "3", env=env).returncode == 0
    run = run_cli("birthday", "--month", "2025-06", "--json", env=env)
    assert run.returncode == 0, run.stderr
    files = sorted(outbox.glob("*.eml"))
    assert files
    for path in files:
        raw = path.read_bytes()
        assert dkim.verify(raw, dnsfunc=dns), path.name
        assert "list-unsubscribe-post" in tags(raw)["h"].lower().split(":")

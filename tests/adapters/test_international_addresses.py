"""International addresses: IDNA domains on the wire, SMTPUTF8 only where the server
offers it, and SES skipping what it cannot take; against the aiosmtpd server and moto."""

from __future__ import annotations

import email
import email.policy
from collections.abc import AsyncIterator, Callable, Iterator
from email.message import EmailMessage
from pathlib import Path

import aioboto3
import pytest
from support.aws_server import MotoServer, moto_raw_messages
from support.smtp_server import SmtpTestServer

from batchrun import Skip, valid_address
from batchrun.db.store import State
from batchrun.errors import PermanentMailError
from batchrun.mail.address import idna_domain, needs_smtputf8, wire_address
from batchrun.mail.base import Message, from_url
from batchrun.mail.file import FileMailer
from batchrun.mail.ses import SesMailer
from batchrun.mail.smtp import SmtpMailer
from batchrun.pipeline.outcomes import classify

SENDER = "birthday@example.com"


def parse_utf8(raw: bytes) -> EmailMessage:
    """Parse a message whose headers may be UTF-8 (the email package escapes 8-bit bytes)."""
    parsed = email.message_from_string(raw.decode("utf-8"), policy=email.policy.SMTPUTF8)
    assert isinstance(parsed, EmailMessage)
    return parsed


def message(to_addr: str, n: int = 1, name: str = "Zoë Ünïcode") -> Message:
    return Message(
        sender=f"Birthday Team <{SENDER}>",
        to_addr=to_addr,
        to_name=name,
        subject="Happy birthday",
        text="Happy birthday!",
        html="<p>Happy birthday!</p>",
        message_id=f"<birthday.2025.{n}@example.com>",
    )


# -- the mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("domain", "wire"),
    [
        ("example.com", "example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example", "xn--bcher-kva.example"),  # case-folded first (UTS #46)
        ("bücher\u3002example", "xn--bcher-kva.example"),  # an ideographic full stop
        ("faß.de", "xn--fa-hia.de"),  # non-transitional: ß is kept, not made "ss"
        ("bücher.under_score.example", "xn--bcher-kva.under_score.example"),  # ASCII kept
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("🎂.example", None),  # IDNA 2008 has no emoji
        ("bü-.example", None),  # a label may not end with a hyphen
        ("ü" + "a" * 70 + ".example", None),  # a label of more than 63 octets
    ],
)
def test_domains_go_out_in_idna(domain: str, wire: str | None) -> None:
    assert idna_domain(domain) == wire


def test_only_the_domain_changes_and_only_a_non_ascii_local_part_needs_smtputf8() -> None:
    assert wire_address("user@bücher.example") == "user@xn--bcher-kva.example"
    assert wire_address("josé@bücher.example") == "josé@xn--bcher-kva.example"
    assert wire_address("plain@example.com") == "plain@example.com"
    assert not needs_smtputf8("user@bücher.example")
    assert needs_smtputf8("josé@example.com")
    assert not needs_smtputf8("plain@example.com")
    with pytest.raises(ValueError, match="IDNA"):
        wire_address("user@🎂.example")


@pytest.mark.parametrize(
    ("addr", "ok"),
    [
        ("user@bücher.example", True),
        ("josé@exämple.com", True),  # deliverable where SMTPUTF8 is
        ("josé@localhost", True),
        ("user@🎂.example", False),  # no IDNA form: never deliverable
        ("user@bü-.example", False),
        ("user@bücher", False),  # one label, as for ASCII
        ("é" * 120 + "@example.com", True),  # 252 octets
        ("é" * 125 + "@example.com", False),  # 137 characters, but 262 octets
        ("user@bücher .example", False),  # whitespace stays forbidden
    ],
)
def test_valid_address_judges_a_non_ascii_address_by_its_wire_form(addr: str, ok: bool) -> None:
    assert valid_address(addr) is ok


def test_the_to_header_carries_the_idna_domain_and_stays_ascii() -> None:
    msg = message("user@bücher.example")
    raw = msg.to_bytes()
    raw.decode("ascii")
    assert msg.envelope_to == "user@xn--bcher-kva.example"
    (to,) = msg.to_email()["To"].addresses
    assert (to.addr_spec, to.display_name) == ("user@xn--bcher-kva.example", "Zoë Ünïcode")


@pytest.mark.parametrize("name", ["Zoë Ünïcode", "", "Hopper, Grace", "a" * 150])
def test_a_utf8_local_part_is_written_only_when_allowed(name: str) -> None:
    msg = message("josé@bücher.example", name=name)
    with pytest.raises(ValueError, match="SMTPUTF8"):
        msg.to_bytes()
    parsed = msg.to_email(utf8=True)
    (to,) = parsed["To"].addresses
    assert to.addr_spec == "josé@xn--bcher-kva.example"
    assert to.display_name == name
    head = msg.to_bytes(utf8=True).split(b"\r\n\r\n")[0]
    assert "josé".encode() in head  # RFC 6532: the address itself in UTF-8
    assert head.replace("josé".encode(), b"").isascii(), "nothing else is 8-bit"


# -- SMTP, with and without SMTPUTF8 --------------------------------------------------------


@pytest.fixture
def utf8_server() -> Iterator[SmtpTestServer]:
    with SmtpTestServer(smtputf8=True) as server:
        yield server


@pytest.fixture
async def make_mailer() -> AsyncIterator[Callable[[SmtpTestServer], SmtpMailer]]:
    mailers: list[SmtpMailer] = []

    def make(server: SmtpTestServer) -> SmtpMailer:
        mailer = from_url(server.url, timeout=5)
        assert isinstance(mailer, SmtpMailer)
        mailers.append(mailer)
        return mailer

    yield make
    for mailer in mailers:
        await mailer.close()


async def test_an_idn_domain_goes_as_idna_to_a_server_without_smtputf8(
    smtp_server: SmtpTestServer, make_mailer: Callable[[SmtpTestServer], SmtpMailer]
) -> None:
    await make_mailer(smtp_server).send(message("user@bücher.example"))
    (received,) = smtp_server.wait_for_messages(1)
    assert received.recipients == ["user@xn--bcher-kva.example"]
    assert not any(o.upper() == "SMTPUTF8" for o in received.mail_options)
    (to,) = received.email["To"].addresses
    assert to.addr_spec == "user@xn--bcher-kva.example"


async def test_a_utf8_local_part_without_smtputf8_fails_that_user_with_a_reason(
    smtp_server: SmtpTestServer, make_mailer: Callable[[SmtpTestServer], SmtpMailer]
) -> None:
    mailer = make_mailer(smtp_server)
    with pytest.raises(PermanentMailError) as info:
        await mailer.send(message("josé@bücher.example"))
    assert "SMTPUTF8" in info.value.reason and "not ASCII" in info.value.reason
    outcome = classify(info.value)
    assert outcome.state is State.FAILED and not outcome.connection
    await mailer.send(message("next@example.com", n=2))  # the session is still usable
    (received,) = smtp_server.wait_for_messages(1)
    assert received.recipients == ["next@example.com"]
    assert smtp_server.connections_opened == 1
    assert smtp_server.transactions == 1, "nothing of the refused address reached the server"


async def test_a_utf8_local_part_goes_with_smtputf8_when_the_server_offers_it(
    utf8_server: SmtpTestServer, make_mailer: Callable[[SmtpTestServer], SmtpMailer]
) -> None:
    mailer = make_mailer(utf8_server)
    await mailer.send(message("josé@bücher.example"))
    await mailer.send(message("plain@example.com", n=2))
    utf8, plain = utf8_server.wait_for_messages(2)
    assert utf8.recipients == ["josé@xn--bcher-kva.example"]
    assert "SMTPUTF8" in [o.upper() for o in utf8.mail_options]
    (to,) = parse_utf8(utf8.raw)["To"].addresses
    assert to.addr_spec == "josé@xn--bcher-kva.example"
    assert to.display_name == "Zoë Ünïcode"
    # An ASCII address never asks for the extension, even where it is offered.
    assert plain.recipients == ["plain@example.com"]
    assert "SMTPUTF8" not in [o.upper() for o in plain.mail_options]


async def test_the_file_outbox_writes_a_utf8_local_part_as_rfc_6532(tmp_path: Path) -> None:
    mailer = FileMailer(tmp_path)
    msg = message("josé@bücher.example")
    await mailer.send(msg)
    parsed = parse_utf8(mailer.path_for(msg).read_bytes())
    assert parsed["To"].addresses[0].addr_spec == "josé@xn--bcher-kva.example"


# -- SES --------------------------------------------------------------------------------------


@pytest.fixture
async def ses(moto_server: MotoServer) -> AsyncIterator[SesMailer]:
    moto_server.reset()
    env = {**moto_server.env, "AWS_ACCESS_KEY_ID": "AKIATEST", "AWS_SECRET_ACCESS_KEY": "x"}
    session = aioboto3.Session(
        aws_access_key_id="AKIATEST", aws_secret_access_key="x", region_name="us-east-1"
    )
    async with session.client("sesv2", endpoint_url=env["AWS_ENDPOINT_URL"]) as client:
        await client.create_email_identity(EmailIdentity=SENDER)
    mailer = SesMailer("us-east-1", env=env, timeout=5)
    try:
        yield mailer
    finally:
        await mailer.close()


async def test_ses_gets_the_idna_domain_and_skips_a_utf8_local_part(
    moto_server: MotoServer, ses: SesMailer
) -> None:
    await ses.send(message("user@bücher.example"))
    with pytest.raises(Skip) as info:
        await ses.send(message("josé@bücher.example", n=2))
    assert "non-ASCII local part" in info.value.reason
    assert classify(info.value).state is State.SKIPPED
    (held,) = moto_raw_messages(moto_server)  # the skipped one never reached SES
    assert "user@xn--bcher-kva.example" in held["destinations"]
    assert not any("ü" in d for d in held["destinations"])
    parsed = email.message_from_string(held["raw_data"], policy=email.policy.SMTP)
    assert parsed["To"].addresses[0].addr_spec == "user@xn--bcher-kva.example"

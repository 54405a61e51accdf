"""Mail: message building, address checks, URL choice, and every backend against real I/O."""

from __future__ import annotations

import asyncio
import email
import email.policy
import html
import random
import re
import socket
import stat
import subprocess
import sys
import time
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterator
from email.header import decode_header, make_header
from email.message import EmailMessage
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
from support.ports import free_port
from support.smtp_server import SmtpTestServer, fail_first, fail_recipients

from batchrun.errors import (
    ConfigError,
    MailConnectionError,
    MailError,
    PermanentMailError,
    TemporaryMailError,
)
from batchrun.mail import Mailer, Message, from_url, smtp_transaction, valid_address
from batchrun.mail import smtp as smtp_module
from batchrun.mail.base import clean_text
from batchrun.mail.console import ConsoleMailer, DiscardMailer
from batchrun.mail.file import FileMailer, file_name
from batchrun.mail.smtp import SmtpMailer

REPO = Path(__file__).resolve().parents[2]


def make_message(n: int = 42, **overrides: str) -> Message:
    fields = {
        "sender": "Birthday Team <birthday@example.com>",
        "to_addr": f"user{n}@example.com",
        "to_name": "Zoë Ünïcode",
        "subject": "Happy birthday, Zoë 🎂",
        "text": "Your gift code: ABCD-EFGH-JKMN-PQRS ✓",
        "html": "<p>Your gift code: <b>ABCD-EFGH-JKMN-PQRS</b> ✓</p>",
        "message_id": f"<birthday.2025.{n}@example.com>",
    }
    fields.update(overrides)
    return Message(**fields)


def parse(message: Message) -> tuple[bytes, EmailMessage]:
    raw = message.to_bytes()  # the bytes on the wire
    return raw, email.message_from_bytes(raw, policy=email.policy.default)


def header_block(raw: bytes) -> bytes:
    return raw.split(b"\r\n\r\n", 1)[0]


# -- building messages -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["Zoë Ünïcode", "李小龙", "Ольга Петрова", 'O\'Brien, "Jr."', "Ana 🎂 Lee", "Plain Name"],
)
def test_display_name_round_trips_through_rfc2047(name: str) -> None:
    raw, parsed = parse(make_message(to_name=name))
    (address,) = parsed["To"].addresses
    assert address.display_name == name
    assert address.addr_spec == "user42@example.com"
    header_block(raw).decode("ascii")  # non-ASCII names are encoded, never raw 8-bit


@pytest.mark.parametrize(
    "hostile",
    [
        "Eve\r\nBcc: evil@x",
        "Eve\nBcc: evil@x",
        "Eve\rBcc: evil@x",
        "Eve\x00\x1b\x7f\x85Bcc: evil@x",
        "Eve\u2028Bcc: evil@x",
        "Eve\r\n\r\nbody injection",
    ],
)
def test_control_characters_in_name_or_subject_never_add_a_header(hostile: str) -> None:
    raw, parsed = parse(make_message(to_name=hostile, subject=hostile))
    assert sorted(parsed.keys()) == sorted(
        [
            "From",
            "To",
            "Subject",
            "Date",
            "Message-ID",
            "X-Batchrun-Id",
            "Auto-Submitted",
            "MIME-Version",
            "Content-Type",
        ]
    )
    assert "Bcc" not in parsed
    for line in header_block(raw).split(b"\r\n"):
        assert not line.lower().startswith(b"bcc")
    (address,) = parsed["To"].addresses
    assert address.addr_spec == "user42@example.com"
    assert not any(ch in address.display_name for ch in "\r\n\x00\x85\u2028")
    assert "\n" not in str(parsed["Subject"])
    body = parsed.get_body(("plain",))
    assert body is not None
    assert body.get_content().startswith("Your gift code")


def test_long_display_name_is_capped_at_200_characters() -> None:
    raw, _ = parse(make_message(to_name="é" * 500))
    compat = email.message_from_bytes(raw, policy=email.policy.compat32)
    # Decoded the RFC 2047 way (whitespace between adjacent encoded-words is dropped);
    # Python 3.11's structured-header parser wrongly keeps it, real mail clients do not.
    to = str(make_header(decode_header(compat["To"])))
    assert to == "é" * 200 + " <user42@example.com>"


def test_message_has_id_date_and_both_utf8_parts() -> None:
    message = make_message()
    _, parsed = parse(message)
    assert parsed["Message-ID"] == "<birthday.2025.42@example.com>"
    assert parsed["X-Batchrun-Id"] == parsed["Message-ID"]  # survives SES's own Message-ID
    assert parsed["From"] == "Birthday Team <birthday@example.com>"
    assert parsed["Subject"] == "Happy birthday, Zoë 🎂"
    assert parsed.get_content_type() == "multipart/alternative"
    assert parsedate_to_datetime(parsed["Date"]).tzinfo is not None
    parts = {part.get_content_type(): part for part in parsed.iter_parts()}
    assert set(parts) == {"text/plain", "text/html"}
    for part in parts.values():
        assert part.get_content_charset() == "utf-8"
    assert parts["text/plain"].get_content().rstrip("\r\n") == message.text
    # The HTML's ✓ travels as a character reference: what an HTML reader shows is the same.
    html_part = parts["text/html"].get_content().rstrip("\r\n")
    assert html_part == message.html.replace("✓", "&#10003;")
    assert html.unescape(html_part) == message.html


def _encodings(raw: bytes) -> list[str]:
    return re.findall(r"Content-Transfer-Encoding: ([\w-]+)", raw.decode("ascii"))


@pytest.mark.parametrize(
    ("text", "html_text", "expected"),
    [
        ("Plain ASCII.\n\nSecond paragraph.\n", "<p>Plain</p>", ["7bit", "7bit"]),
        ("Zoë ✓\n", "<p>plain</p>", ["quoted-printable", "7bit"]),
        # non-ASCII HTML goes as character references, 7bit, unless <style> or <script> holds it
        ("Zoë\n", "<p>Zoë 🎂</p>", ["quoted-printable", "7bit"]),
        ("Zoë\n", "<style>p::after{content:'✓'}</style><p>Zoë</p>", ["quoted-printable"] * 2),
        # a line that references would take past 998 characters: quoted-printable
        ("Zoë\n", "<p>" + "é" * 300 + "</p>", ["quoted-printable"] * 2),
        ("a" * 999, "<p>" + "b" * 2000 + "</p>", ["quoted-printable", "quoted-printable"]),
        ("old\r\nmac\rends\n", "", ["7bit"]),  # text only: one part
    ],
)
def test_text_parts_are_7bit_or_quoted_printable_never_base64(
    text: str, html_text: str, expected: list[str]
) -> None:
    message = make_message(text=text, html=html_text)
    raw, parsed = parse(message)
    assert _encodings(raw) == expected
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    assert b"\n" not in raw.replace(b"\r\n", b"")  # no bare LF (nor CR) on the wire
    plain = parsed.get_body(("plain",))
    assert plain is not None
    # CRLF on the wire (the canonical form of text), the text's own lines read back.
    lines = text.replace("\r\n", "\n").replace("\r", "\n")
    assert plain.get_content().replace("\r\n", "\n") == lines
    if html_text:
        part = parsed.get_body(("html",))
        assert part is not None
        got = part.get_content().replace("\r\n", "\n")
        if expected[1] == "quoted-printable" or html_text.isascii():
            assert got == html_text  # as written
        else:  # character references, which an HTML reader shows as the same text
            assert got.isascii() and html.unescape(got) == html_text
    if expected[0] == "7bit":  # readable as it is on the wire
        assert text.splitlines()[0].encode() in raw


def test_envelope_sender_is_the_bare_address() -> None:
    assert make_message().envelope_sender == "birthday@example.com"
    assert make_message(sender="b@example.com").envelope_sender == "b@example.com"


def test_an_address_with_a_line_break_is_refused_not_rewritten() -> None:
    with pytest.raises(ValueError):
        make_message(to_addr="a@example.com\r\nBcc: evil@x").to_email()


# -- address syntax ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "ok"),
    [
        ("bob@example.com", True),
        ("first.last+tag@sub.example.co.uk", True),
        ("bob@localhost", True),
        ("bob@LOCALHOST", True),
        ("josé@exämple.com", True),
        ("bob@", False),
        ("@example.com", False),
        ("no-at-sign", False),
        ("", False),
        ("a@b@example.com", False),
        ("bob@example", False),
        ("bob@.example.com", False),
        ("bob@example.com.", False),
        ("bob@exa..mple.com", False),
        ("bob smith@example.com", False),
        ("bob@example.com ", False),
        ("bob\t@example.com", False),
        ("bob@example.com\r\n", False),
        ("bob\x00@example.com", False),
        ("<bob@example.com>", False),
        ("bob@example.com,eve@example.com", False),
        ('"bob"@example.com', False),
        ("b" * 242 + "@example.com", True),  # 254 characters
        ("b" * 243 + "@example.com", False),  # 255 characters
    ],
)
def test_valid_address(addr: str, ok: bool) -> None:
    assert valid_address(addr) is ok


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Grace Hopper",
        "Hopper, Grace",
        'Grace "Amazing" Hopper',
        "a\\b",
        "O'Brien",
        "Dr. Who",
        "x@y",
        "[bot]",
        "José Martí",
        "李雷",
        "a" * 120,
        "Grace (admin)",
    ],
)
def test_the_to_header_fast_path_agrees_with_formataddr(name: str) -> None:
    from email.utils import formataddr

    from batchrun.mail.base import address_header

    addr = "grace@example.com"
    assert address_header(name, addr) == formataddr((name, addr), charset="utf-8").replace(
        "\n", "\r\n"
    )
    with pytest.raises(ValueError):
        address_header(name, "josé@exämple.com")  # never sent as raw UTF-8 in a header


def test_encoded_names_agree_with_formataddr_for_random_text() -> None:
    """B or Q, whichever formataddr would pick, byte for byte, over names of every kind
    that fit in one encoded word on one line; longer ones are folded
    (test_mail_header_folding.py)."""
    from email.utils import formataddr

    from batchrun.mail.base import address_header

    rng = random.Random(5)
    alphabets = ["abc XYZ-!*+/_=?.", "éüßçøñ", "李雷韩梅", "🎂🎁", "\u00a0\u2009\t"]
    for _ in range(3000):
        pool = "".join(rng.sample(alphabets, rng.randint(1, len(alphabets))))
        name = "".join(rng.choice(pool) for _ in range(rng.randint(1, 60)))
        if rng.random() < 0.5:  # mostly ASCII with one accent: where Q is the shorter
            name = "Jose Maria Garcia-Lopez"[: rng.randint(3, 23)] + rng.choice("éüñ")
        if "=?" in name or name.isascii():
            continue
        expected = formataddr((name, "a@example.com"), charset="utf-8")
        if len(f"From: {expected}") <= 78:
            assert address_header(name, "a@example.com") == expected, name
        else:
            decoded = str(make_header(decode_header(address_header(name, "a@example.com"))))
            assert decoded == f"{name} <a@example.com>"


def test_every_code_point_is_judged_by_its_unicode_category() -> None:
    """The compiled character classes agree with the rule they stand for, everywhere."""
    unsafe = {"Cc", "Cs", "Zl", "Zp"}
    wrong_clean, wrong_address = [], []
    for point in range(sys.maxunicode + 1):
        char = chr(point)
        bad = unicodedata.category(char) in unsafe
        if (clean_text(f"a{char}b") == "a b") is not bad and char != " ":
            wrong_clean.append(hex(point))
        forbidden = bad or char.isspace() or char in '()<>[]:;,\\"'
        if valid_address(f"bo{char}b@example.com") is forbidden and char != "@":
            wrong_address.append(hex(point))
    assert wrong_clean == []
    assert wrong_address == []


# -- choosing a backend by URL -----------------------------------------------------------


def test_from_url_smtp_defaults_and_overrides() -> None:
    mailer = from_url("smtp://mail.example.com:2525", timeout=3, pool_size=2)
    assert isinstance(mailer, SmtpMailer)
    assert (mailer.host, mailer.port, mailer.timeout, mailer.pool_size) == (
        "mail.example.com",
        2525,
        3,
        2,
    )
    mailer = from_url("smtp://mail.example.com?pool=8&timeout=2.5")
    assert isinstance(mailer, SmtpMailer)
    assert (mailer.port, mailer.pool_size, mailer.timeout) == (25, 8, 2.5)


@pytest.mark.parametrize(
    ("url", "port", "use_tls", "start_tls"),
    [
        ("smtp://h", 25, False, None),
        ("smtp://h?starttls=1", 587, False, True),
        ("smtp://h:2525?starttls=0", 2525, False, False),
        ("smtps://h", 465, True, False),
        ("SMTPS://h:4650", 4650, True, False),
    ],
)
def test_from_url_smtp_tls_modes(url: str, port: int, use_tls: bool, start_tls: bool) -> None:
    mailer = from_url(url)
    assert isinstance(mailer, SmtpMailer)
    assert mailer.port == port
    assert mailer.use_tls is use_tls
    assert mailer.start_tls is start_tls


def test_from_url_smtp_credentials_are_decoded_and_never_shown() -> None:
    mailer = from_url("smtp://bob%40corp:s3cr%2Ft@h:587")
    assert isinstance(mailer, SmtpMailer)
    assert (mailer.username, mailer.password) == ("bob@corp", "s3cr/t")
    assert "s3cr" not in repr(mailer)


@pytest.mark.parametrize(
    ("url", "directory"),
    [
        ("file://outbox", Path("outbox")),
        ("file://outbox/june", Path("outbox/june")),
        ("file:///var/outbox", Path("/var/outbox")),
        ("file://./out%20box", Path("out box")),
    ],
)
def test_from_url_file(url: str, directory: Path) -> None:
    mailer = from_url(url)
    assert isinstance(mailer, FileMailer)
    assert mailer.directory == directory
    assert not directory.exists() or directory.is_absolute()  # nothing created until a send


def test_from_url_console_and_discard() -> None:
    assert isinstance(from_url("console://"), ConsoleMailer)
    assert isinstance(from_url("discard://"), DiscardMailer)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://mail.example.com", "unknown mail URL scheme 'http'"),
        ("outbox", "unknown mail URL scheme ''"),
        ("smtp:/mail.example.com", "unknown mail URL scheme ''"),
        ("ses://eu-west-1?profile=x", "ses:// mail URL takes no options"),
        ("smtp://", "needs a host"),
        ("smtp://h:99999", "invalid port"),
        ("smtp://h:port", "invalid port"),
        ("smtp://h?pool=0", "pool='0' must be a positive number"),
        ("smtp://h?pool=2.5", "must be a whole number"),
        ("smtp://h?timeout=soon", "timeout='soon' must be a positive number"),
        ("smtp://h?timeout=nan", "must be a positive number"),
        ("smtp://h?starttls=maybe", "is not 1 or 0"),
        ("smtp://h?tls=1", "unknown option 'tls'"),
        ("smtps://h?starttls=1", "already TLS"),
        ("file://", "needs a directory"),
        ("file://outbox?x=1", "takes no options"),
        ("console://somewhere", "takes no host or path"),
    ],
)
def test_from_url_errors_are_one_clear_line(url: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_url(url)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"timeout": -1.0}, {"pool_size": 0}])
def test_from_url_rejects_nonsense_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        from_url("smtp://h", **kwargs)  # type: ignore[arg-type]


def test_unknown_scheme_error_lists_accepted_schemes() -> None:
    with pytest.raises(ConfigError, match="accepted: smtp://, smtps://, file://, console://"):
        from_url("mailto:bob@example.com")


def test_url_errors_never_show_the_password() -> None:
    for url in (
        "smtp://bob:hunter2@h?bogus=1",
        "smtp://bob:hunter2@h:99999",
        "smtq://bob:hunter2@h",
    ):
        with pytest.raises(ConfigError) as info:
            from_url(url)
        assert "hunter2" not in str(info.value)


def test_non_smtp_backends_never_import_aiosmtplib() -> None:
    code = (
        "import sys\n"
        "from batchrun.mail import from_url\n"
        "for url in ('file://outbox', 'console://', 'discard://'):\n"
        "    from_url(url)\n"
        "try:\n"
        "    from_url('ses://eu-west-1')\n"
        "except Exception:\n"
        "    pass\n"
        "assert 'aiosmtplib' not in sys.modules, 'aiosmtplib was imported'\n"
        "from_url('smtp://localhost')\n"
        "assert 'aiosmtplib' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# -- console and discard -----------------------------------------------------------------


async def test_console_mailer_writes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    mailer = ConsoleMailer()
    await mailer.send(make_message(to_name="Eve\r\nBcc: evil@x"))
    await mailer.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert 'To: "Eve  Bcc: evil@x" <user42@example.com>' in err
    assert "Subject: Happy birthday, Zoë 🎂" in err
    assert "<birthday.2025.42@example.com>" in err
    assert "Your gift code: ABCD-EFGH-JKMN-PQRS ✓" in err
    assert "\nBcc" not in err
    assert mailer.sent == 1


async def test_discard_mailer_counts_and_drops() -> None:
    mailer = DiscardMailer()
    for n in range(3):
        await mailer.send(make_message(n))
    await mailer.close()
    assert mailer.sent == 3


# -- file ----------------------------------------------------------------------------------


async def test_file_mailer_is_owner_only_and_overwrites_on_resend(tmp_path: Path) -> None:
    directory = tmp_path / "outbox" / "june"
    mailer = from_url(f"file://{directory}")
    assert isinstance(mailer, FileMailer)
    assert not directory.exists()

    first = make_message(7, text="first")
    await mailer.send(first)
    await mailer.send(make_message(8))
    await mailer.send(make_message(7, text="second"))  # same Message-ID: a resend
    await mailer.close()

    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = sorted(p.name for p in directory.iterdir())
    assert files == ["birthday.2025.7@example.com.eml", "birthday.2025.8@example.com.eml"]
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    parsed = email.message_from_bytes(
        mailer.path_for(first).read_bytes(), policy=email.policy.default
    )
    body = parsed.get_body(("plain",))
    assert body is not None
    assert body.get_content().strip() == "second"
    assert parsed["Message-ID"] == "<birthday.2025.7@example.com>"


def test_file_names_are_safe_and_distinct() -> None:
    hostile = ["<../../etc/passwd>", "<a/b@x>", "<a_b@x>", "<.hidden@x>", "<>", "<é@x>"]
    names = [file_name(message_id) for message_id in hostile]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name and "\\" not in name
        assert not name.startswith(".")
        assert name.endswith(".eml")
        assert name.isascii()
    assert file_name("<birthday.2025.42@example.com>") == "birthday.2025.42@example.com.eml"
    assert file_name("<a/b@x>") == file_name("<a/b@x>")


async def test_file_mailer_leaves_an_existing_directory_mode_alone(tmp_path: Path) -> None:
    tmp_path.chmod(0o750)
    mailer = FileMailer(tmp_path)
    await mailer.send(make_message())
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["birthday.2025.42@example.com.eml"]


async def test_file_mailer_unwritable_directory_is_a_connection_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "taken"
    not_a_dir.write_text("a file where the outbox should be")
    with pytest.raises(MailConnectionError, match="cannot write"):
        await FileMailer(not_a_dir).send(make_message())


async def test_file_mailer_refuses_a_broken_address(tmp_path: Path) -> None:
    with pytest.raises(PermanentMailError):
        await FileMailer(tmp_path).send(make_message(to_addr="a@example.com\nBcc: x@y"))
    assert list(tmp_path.iterdir()) == []


# -- SMTP against a real aiosmtpd server ---------------------------------------------------

MakeMailer = Callable[..., SmtpMailer]


@pytest.fixture
def smtp_server() -> Iterator[SmtpTestServer]:
    """A fresh server per test, shadowing conftest's shared one on purpose.

    These tests count connections exactly and leave hung sessions behind, so each gets
    its own port; starting one takes a few milliseconds.
    """
    with SmtpTestServer() as server:
        yield server


@pytest.fixture
async def make_mailer() -> AsyncIterator[MakeMailer]:
    mailers: list[Mailer] = []

    def make(url: str, **kwargs: Any) -> SmtpMailer:
        mailer = from_url(url, **kwargs)
        assert isinstance(mailer, SmtpMailer)
        mailers.append(mailer)
        return mailer

    yield make
    for mailer in mailers:
        await mailer.close()


async def test_many_messages_share_one_connection(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    mailer = make_mailer(smtp_server.url)
    for n in range(10):
        await mailer.send(make_message(n))
    assert smtp_server.connections_opened == 1
    received = smtp_server.messages
    assert [m.message_id for m in received] == [
        f"<birthday.2025.{n}@example.com>" for n in range(10)
    ]
    assert [m.recipients for m in received] == [[f"user{n}@example.com"] for n in range(10)]
    assert {m.mail_from for m in received} == {"birthday@example.com"}
    to = received[0].email["To"].addresses[0]
    assert (to.display_name, to.addr_spec) == ("Zoë Ünïcode", "user0@example.com")

    await mailer.close()
    assert mailer.open_connections == 0
    await asyncio.to_thread(smtp_server.wait_for_open_connections, 0)
    with pytest.raises(MailConnectionError, match="closed"):
        await mailer.send(make_message())


@pytest.mark.parametrize("stage", ["rcpt", "data"])
@pytest.mark.parametrize(
    ("reply", "error", "reason"),
    [
        ("451 4.3.0 Try again later", TemporaryMailError, "451 4.3.0 Try again later"),
        ("550 5.1.1 No such user", PermanentMailError, "550 5.1.1 No such user"),
        ("552 5.3.4 Message too big", PermanentMailError, "552 5.3.4 Message too big"),
    ],
)
async def test_error_replies_are_classified_and_the_connection_survives(
    smtp_server: SmtpTestServer,
    make_mailer: MakeMailer,
    stage: str,
    reply: str,
    error: type[MailError],
    reason: str,
) -> None:
    mailer = make_mailer(smtp_server.url)
    await mailer.send(make_message(1))
    smtp_server.set_policy(fail_recipients({"user2@example.com": reply}), stage=stage)  # type: ignore[arg-type]

    with pytest.raises(MailError) as info:
        await mailer.send(make_message(2))
    assert type(info.value) is error
    assert info.value.reason == reason

    await mailer.send(make_message(3))  # same connection, after RSET
    assert smtp_server.connections_opened == 1
    assert smtp_server.message_ids() == [
        "<birthday.2025.1@example.com>",
        "<birthday.2025.3@example.com>",
    ]


async def test_a_server_that_recovers_accepts_the_retry(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    smtp_server.set_policy(fail_first(2, "451 4.3.0 Try again later"))
    mailer = make_mailer(smtp_server.url)
    for _ in range(2):
        with pytest.raises(TemporaryMailError):
            await mailer.send(make_message())
    await mailer.send(make_message())
    assert smtp_server.rejected == 2
    assert smtp_server.message_ids() == ["<birthday.2025.42@example.com>"]


async def test_421_is_a_connection_error_and_the_connection_is_replaced(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    mailer = make_mailer(smtp_server.url)
    smtp_server.set_policy(fail_first(1, "421 4.3.2 Service shutting down"))
    with pytest.raises(MailConnectionError, match=re.escape("421 4.3.2")):
        await mailer.send(make_message(1))
    assert mailer.open_connections == 0
    await mailer.send(make_message(2))
    assert smtp_server.connections_opened == 2
    assert smtp_server.message_ids() == ["<birthday.2025.2@example.com>"]


async def test_connection_refused_fails_fast(make_mailer: MakeMailer) -> None:
    port = free_port()
    mailer = make_mailer(f"smtp://127.0.0.1:{port}", timeout=10)
    started = time.monotonic()
    with pytest.raises(MailConnectionError) as info:
        await mailer.send(make_message())
    assert time.monotonic() - started < 5  # far below the 10 s timeout
    assert f"127.0.0.1:{port}" in info.value.reason
    assert mailer.open_connections == 0


async def test_a_hanging_server_times_out_and_the_next_send_reconnects(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    mailer = make_mailer(smtp_server.url + "?timeout=0.5")
    await mailer.send(make_message(1))
    smtp_server.set_latency(60)
    started = time.monotonic()
    with pytest.raises(MailConnectionError, match="timed out"):
        await mailer.send(make_message(2))
    assert 0.4 < time.monotonic() - started < 5
    assert mailer.open_connections == 0  # the desynchronised connection was dropped

    smtp_server.set_latency(0)
    await mailer.send(make_message(3))
    assert smtp_server.connections_opened == 2
    assert smtp_server.message_ids() == [
        "<birthday.2025.1@example.com>",
        "<birthday.2025.3@example.com>",
    ]


async def test_a_server_that_never_greets_times_out_on_connect(make_mailer: MakeMailer) -> None:
    # A listening socket nobody accepts on: the kernel completes the TCP handshake, then
    # silence, like a wedged server.
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        port = listener.getsockname()[1]
        mailer = make_mailer(f"smtp://127.0.0.1:{port}?timeout=0.5")
        started = time.monotonic()
        with pytest.raises(MailConnectionError, match=re.escape("did not answer within 0.5 s")):
            await mailer.send(make_message())
        assert 0.4 < time.monotonic() - started < 5
        assert mailer.open_connections == 0


async def test_a_slow_handshake_is_bounded_by_the_timeout_overall(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    smtp_server.set_latency(0, connect=60)
    mailer = make_mailer(smtp_server.url + "?timeout=0.5")
    started = time.monotonic()
    with pytest.raises(MailConnectionError):
        await mailer.send(make_message())
    assert 0.4 < time.monotonic() - started < 5


async def test_concurrent_sends_never_exceed_the_pool(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    smtp_server.set_latency(0.05)  # keep sends overlapping so the pool fills
    mailer = make_mailer(smtp_server.url, pool_size=4)
    peak = 0

    async def send(n: int) -> None:
        nonlocal peak
        await mailer.send(make_message(n))
        peak = max(peak, mailer.open_connections)

    async with asyncio.TaskGroup() as group:
        for n in range(20):
            group.create_task(send(n))

    assert smtp_server.max_open_connections == 4
    assert smtp_server.connections_opened == 4  # each reused, none replaced
    assert peak <= 4
    assert sorted(str(mid) for mid in smtp_server.message_ids()) == sorted(
        f"<birthday.2025.{n}@example.com>" for n in range(20)
    )


async def test_a_connection_dropped_while_idle_is_replaced(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Probe every reused connection, so the drop is found even before the loop has read
    # the server's FIN (a real idle drop is older than the probe threshold).
    monkeypatch.setattr(smtp_module, "IDLE_PROBE_AFTER_S", 0.0)
    mailer = make_mailer(smtp_server.url)
    await mailer.send(make_message(1))
    smtp_server.drop_connections()
    await mailer.send(make_message(2))
    assert smtp_server.connections_opened == 2
    assert smtp_server.message_ids() == [
        "<birthday.2025.1@example.com>",
        "<birthday.2025.2@example.com>",
    ]


async def test_errors_never_contain_the_password(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    # The test server offers no AUTH, so the login fails during connect.
    mailer = make_mailer(f"smtp://bob:hunter2@127.0.0.1:{smtp_server.port}")
    with pytest.raises(MailConnectionError) as info:
        await mailer.send(make_message())
    chain: list[BaseException] = [info.value]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    for exc in chain:
        assert "hunter2" not in str(exc)
    assert "hunter2" not in repr(mailer)


@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN"])
async def test_a_server_that_echoes_the_login_back_shows_no_password(
    make_mailer: MakeMailer, mechanism: str
) -> None:
    """The password in base64, as AUTH PLAIN and AUTH LOGIN send it, is masked too when a
    server puts what it was sent into its refusal (the reason is stored and shown)."""
    got: list[str] = []

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 echo ESMTP\r\n")
        while line := (await reader.readline()).decode().strip():
            verb = line.split(" ", 1)[0].upper()
            if verb == "EHLO":
                writer.write(f"250-echo\r\n250 AUTH {mechanism}\r\n".encode())
            elif verb == "QUIT":
                writer.write(b"221 bye\r\n")
                break
            else:
                got.append(line)
                done = mechanism == "PLAIN" or len(got) == 2  # LOGIN: verb and user, password
                reply = f"535 5.7.8 refused: {' | '.join(got)}" if done else "334 go on"
                writer.write(f"{reply}\r\n".encode())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(session, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        mailer = make_mailer(f"smtp://bob:hunter2hunter2@127.0.0.1:{port}")
        with pytest.raises(MailConnectionError, match="refused the login") as info:
            await mailer.send(make_message())
    finally:
        server.close()
    assert got, "the server saw the login"
    encoded = [w for line in got for w in line.split()[-1:]]
    assert any("hunter2" not in w and len(w) >= 12 for w in encoded)  # base64 went out
    for secret in ("hunter2hunter2", *encoded[-1:]):
        assert secret not in str(info.value), (secret, str(info.value))


async def test_an_unbuildable_message_is_permanent_and_sends_nothing(
    smtp_server: SmtpTestServer, make_mailer: MakeMailer
) -> None:
    mailer = make_mailer(smtp_server.url)
    with pytest.raises(PermanentMailError):
        await mailer.send(make_message(to_addr="a@example.com\r\nRCPT TO:<evil@x>"))
    assert smtp_server.transactions == 0
    assert smtp_server.connections_opened == 0


def test_smtp_mailer_rejects_a_nonsense_pool() -> None:
    with pytest.raises(ValueError):
        SmtpMailer("h", 25, pool_size=0)
    with pytest.raises(ValueError):
        SmtpMailer("h", 25, timeout=0)


# -- the wire bytes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "subject"),
    [
        ("Ada Lovelace", "Happy birthday!"),
        ("Zoë Müller-Lüdenscheidt " * 12, "Joyeux anniversaire, Zoë 🎂"),
        ("李小龍", "生日快乐"),
        ('Eve "the" <admin@evil> , x', "plain"),
        ("", "no name"),
    ],
)
def test_wire_bytes_match_what_the_email_package_would_build(name: str, subject: str) -> None:
    import email.policy
    from email.message import EmailMessage

    message = make_message(to_name=name, subject=subject)
    raw = message.to_bytes()
    assert all(len(line) <= 998 for line in raw.split(b"\r\n")), "RFC 5322 line limit"
    assert b"\n" not in raw.replace(b"\r\n", b""), "bare LF on the wire"
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    reference = EmailMessage(policy=email.policy.default)
    reference["To"] = message.display_to
    reference["Subject"] = " ".join(subject.split())
    # A long name is folded into several encoded words. RFC 2047 §6.2 drops the fold
    # between two of them, as mail clients do; Python 3.11's address parser keeps it as a
    # space (CPython gh-128110), so the name is read with those folds taken out.
    unfolded = re.sub(rb"\?=\r\n =\?", b"?==?", header_block(raw))
    to = email.message_from_bytes(unfolded, policy=email.policy.default)["To"]
    assert str(to) == str(reference["To"])
    assert str(parsed["Subject"]) == str(reference["Subject"])
    assert parsed["Message-ID"] == message.message_id
    parts = {p.get_content_type(): p.get_content() for p in parsed.iter_parts()}
    assert parts.keys() == {"text/plain", "text/html"}
    assert parts["text/plain"] == message.text
    # The HTML as its reader shows it (its ✓ travels as &#10003;, 7bit).
    assert html.unescape(parts["text/html"]) == message.html and parts["text/html"].isascii()


@pytest.mark.parametrize(
    "raw",
    [
        b"Subject: dots\r\n\r\n.starts a line\r\n..two\r\nlast line without CRLF",
        b"Subject: dots\r\n\r\n.\r\nbody after a lone dot line\r\n",
    ],
)
async def test_lines_starting_with_a_dot_arrive_as_written(
    smtp_server: SmtpTestServer, raw: bytes
) -> None:
    # The mailer dot-stuffs DATA itself (smtp_transaction, not aiosmtplib.sendmail): a line
    # that is or starts with "." must reach the server unchanged, not end the message early.
    import aiosmtplib

    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=smtp_server.port, start_tls=False)
    await client.connect()
    await client.ehlo()
    try:
        await smtp_transaction.transaction(client, "birthday@example.com", "user1@example.com", raw)
        # The session is still in step afterwards: the next message on it arrives whole.
        second = make_message(2)
        await smtp_transaction.transaction(
            client, second.envelope_sender, second.envelope_to, second.to_bytes()
        )
    finally:
        await client.quit()
    received = smtp_server.messages
    assert received[0].raw.replace(b"\r\n", b"\n").rstrip(b"\n") == raw.replace(
        b"\r\n", b"\n"
    ).rstrip(b"\n")
    assert received[1].message_id == "<birthday.2025.2@example.com>"
    assert smtp_server.connections_opened == 1

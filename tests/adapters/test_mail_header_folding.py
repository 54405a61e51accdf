"""Long names and subjects: RFC 2047 encoded words of at most 75 characters, folded so
that no header line holding one is longer than 78 (a 200-emoji name unfolded makes a
1,100-byte To line, which a server refuses with ``500 Line too long``)."""

from __future__ import annotations

import email
import email.policy
import itertools
import random
import re
from email.charset import Charset
from email.header import decode_header, make_header
from email.message import EmailMessage

import aiosmtplib
import pytest
from support.smtp_server import HOST, SmtpTestServer

from batchrun.mail import Message, from_url
from batchrun.mail.base import MAX_NAME_CHARS, address_header, clean_text

NAMES = {
    "4-byte": "🎂" * 200,
    "3-byte": "李" * 200,
    "2-byte": "é" * 200,
    "mixed": "Zoë 李小龍 🎂 Ольга O'Brien-Smith, Jr. " * 8,  # cut to 200 characters
    "mostly ASCII": "Jose Maria Garcia-Lopez de la Ñ " * 8,  # Q words
    "encoded-word text": "=?utf-8?q?evil?= " * 15,  # ASCII, encoded once more
}
ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")
# RFC 2047 §6.2: whitespace between two encoded words is not text, and mail clients drop
# it; Python 3.11's address parser keeps a fold there as a space (CPython gh-128110). A
# folded name is read the way a client reads it by taking those folds out first.
FOLD_BETWEEN_WORDS = re.compile(rb"\?=\r\n =\?")


def make_message(name: str, **overrides: str) -> Message:
    fields = {
        "sender": "Birthday Team <birthday@example.com>",
        "to_addr": "user42@example.com",
        "to_name": name,
        "subject": "Happy birthday 🎂",
        "text": "Your gift code: ABCD-EFGH-JKMN-PQRS ✓",
        "html": "<p>Your gift code: <b>ABCD-EFGH-JKMN-PQRS</b> ✓</p>",
        "message_id": "<birthday.2025.42@example.com>",
    }
    fields.update(overrides)
    return Message(**fields)


def read_as_a_client(raw: bytes) -> EmailMessage:
    head, sep, body = raw.partition(b"\r\n\r\n")
    unfolded = FOLD_BETWEEN_WORDS.sub(b"?==?", head) + sep + body
    parsed = email.message_from_bytes(unfolded, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


def header_lines(raw: bytes) -> list[str]:
    return raw.partition(b"\r\n\r\n")[0].decode("ascii").split("\r\n")


def unfolded_header(raw: bytes, name: str) -> str:
    """The header's value, its folds joined, as written (encoded words not decoded)."""
    compat = email.message_from_bytes(raw, policy=email.policy.compat32)
    return re.sub(r"\r?\n[ \t]", " ", str(compat[name]))


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_a_long_name_is_folded_into_short_encoded_words_that_read_back(name: str) -> None:
    expected = clean_text(name, MAX_NAME_CHARS)
    raw = make_message(name).to_bytes()

    assert all(len(line) <= 78 for line in raw.split(b"\r\n")), "RFC 5322's 78 characters"
    to = unfolded_header(raw, "To")
    words = ENCODED_WORD.findall(to)
    assert len(words) > 1, "folded, not one over-long word"
    assert all(len(word) <= 75 for word in words), "RFC 2047's 75 characters"
    assert ENCODED_WORD.sub("", to).strip() == "<user42@example.com>", "nothing but words"

    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["To"].defects == ()
    (address,) = read_as_a_client(raw)["To"].addresses
    assert (address.display_name, address.addr_spec) == (expected, "user42@example.com")
    # The standard library's own RFC 2047 decoder, which drops those folds itself.
    assert str(make_header(decode_header(to))) == f"{expected} <user42@example.com>"


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_each_word_holds_whole_characters_in_the_shorter_of_b_and_q(name: str) -> None:
    """No character is cut across two words, and each word is what formataddr would
    write for its own piece of the name (the shorter of B and Q, Q on a tie)."""
    to = unfolded_header(make_message(name).to_bytes(), "To")
    pieces = []
    for word in ENCODED_WORD.findall(to):
        ((data, charset),) = decode_header(word)
        assert charset == "utf-8"
        assert isinstance(data, bytes)
        piece = data.decode("utf-8")  # strict: a split character would raise here
        assert Charset("utf-8").header_encode(piece) == word
        pieces.append(piece)
    assert "".join(pieces) == clean_text(name, MAX_NAME_CHARS)


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_a_long_sender_name_and_subject_are_folded_too(name: str) -> None:
    subject = f"Happy birthday, {name}"
    sender_name = re.sub(r"[,.]", "", clean_text(name, 100))  # no specials: unquoted
    raw = make_message(
        "Ana", sender=f"{sender_name} <birthday@example.com>", subject=subject
    ).to_bytes()
    lines = header_lines(raw)
    assert all(len(line) <= 78 for line in lines if ENCODED_WORD.search(line)), lines
    assert all(len(line) <= 998 for line in lines)
    for header in ("From", "Subject"):
        words = ENCODED_WORD.findall(unfolded_header(raw, header))
        assert len(words) > 1, header
        assert all(len(word) <= 75 for word in words), header
    parsed = read_as_a_client(raw)
    (sender,) = parsed["From"].addresses
    assert (sender.display_name, sender.addr_spec) == (sender_name, "birthday@example.com")
    assert parsed["Subject"] == clean_text(subject)
    # Subject is unstructured text: 3.11's parser drops the folds there as it should.
    plain = email.message_from_bytes(raw, policy=email.policy.default)
    assert plain["Subject"] == clean_text(subject)


@pytest.mark.parametrize("prefix", [len("To: "), len("From: ")])
def test_the_first_line_leaves_room_for_the_header_name(prefix: int) -> None:
    for length in range(1, 80):
        for name in ("é" * length, "🎂" * length, "aé" * length):
            value = address_header(name, "user@example.com", prefix)
            first, *rest = value.split("\r\n")
            assert prefix + len(first) <= 78 or not ENCODED_WORD.search(first), value
            assert all(len(line) <= 78 for line in rest), value


def test_a_name_that_fits_in_one_word_moves_a_long_address_to_its_own_line() -> None:
    from email.utils import formataddr

    long_addr = "a" * 60 + "@example.com"
    value = address_header("Zoë", long_addr)
    assert value == "=?utf-8?q?Zo=C3=AB?=\r\n <" + long_addr + ">"
    assert address_header("Zoë", "z@example.com") == formataddr(("Zoë", "z@example.com"))
    raw = make_message("Zoë", to_addr=long_addr).to_bytes()
    (address,) = email.message_from_bytes(raw, policy=email.policy.default)["To"].addresses
    assert (address.display_name, address.addr_spec) == ("Zoë", long_addr)


async def test_a_200_emoji_name_is_accepted_by_a_real_smtp_server(
    smtp_server: SmtpTestServer,
) -> None:
    message = make_message(NAMES["4-byte"])
    mailer = from_url(smtp_server.url)
    try:
        await mailer.send(message)
    finally:
        await mailer.close()
    (received,) = smtp_server.wait_for_messages(1)
    assert received.recipients == ["user42@example.com"]
    (address,) = read_as_a_client(received.raw)["To"].addresses
    assert address.display_name == "🎂" * 200
    assert max(len(line) for line in received.raw.split(b"\r\n")) <= 78

    # The same message with its To header unfolded onto one line: the server refuses it.
    unfolded = FOLD_BETWEEN_WORDS.sub(b"?= =?", message.to_bytes())
    assert max(len(line) for line in unfolded.split(b"\r\n")) > 1000
    async with aiosmtplib.SMTP(hostname=HOST, port=smtp_server.port, timeout=10) as client:
        with pytest.raises(aiosmtplib.SMTPDataError) as info:
            await client.sendmail(message.envelope_sender, [message.to_addr], unfolded)
    assert info.value.code == 500
    assert "Line too long" in info.value.message


def test_random_text_is_cut_into_full_words_of_whole_characters() -> None:
    """Each word but the last is full (one more character would not fit in 75)."""
    from batchrun.mail.base import encoded_words

    rng = random.Random(11)
    alphabets = ["abc XYZ-!*+/_=?.", "éüßçøñ", "李雷韩梅", "🎂🎁", "\u00a0\u2009\t"]
    utf8 = Charset("utf-8")
    for _ in range(1000):
        pool = "".join(rng.sample(alphabets, rng.randint(1, len(alphabets))))
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 250)))
        room = rng.choice([69, 72, 74, 75])
        pieces = []
        for word in encoded_words(text, room).split("\r\n "):
            assert len(word) <= (room if not pieces else 75), word
            ((data, _),) = decode_header(word)
            assert isinstance(data, bytes)
            pieces.append(data.decode("utf-8"))
            assert utf8.header_encode(pieces[-1]) == word
        assert "".join(pieces) == text
        for i, (piece, following) in enumerate(itertools.pairwise(pieces)):
            longer = utf8.header_encode(piece + following[0])
            assert len(longer) > (room if i == 0 else 75), (piece, following)


# -- ASCII headers: folded at spaces, RFC 5322 section 2.2.3 --------------------------------

LONG_SUBJECT = " ".join(f"word{n:03d}" for n in range(160))[:1225]  # 1,225 bytes of ASCII


def test_a_1225_byte_ascii_subject_is_folded_and_reads_back_the_same() -> None:
    assert len(LONG_SUBJECT) == 1225 and LONG_SUBJECT.isascii()
    message = make_message("Ada", subject=LONG_SUBJECT)
    raw = message.to_bytes()
    assert max(len(line) for line in header_lines(raw)) <= 78
    assert message.to_email()["Subject"] == LONG_SUBJECT  # unfolding gives it back
    assert b"=?" not in raw.partition(b"\r\n\r\n")[0]  # plain text, not encoded words


@pytest.mark.parametrize(
    ("subject", "limit"),
    [
        ("x" * 1200, 78),  # no space anywhere: encoded words, cut anywhere
        ("Happy  birthday, " + "y" * 900 + "  and   more " * 20, 998),  # one word of 900
        ("a " * 600, 78),
    ],
)
def test_no_header_line_is_ever_over_998_and_unfolding_restores_the_text(
    subject: str, limit: int
) -> None:
    message = make_message("Ada", subject=subject)
    raw = message.to_bytes()
    assert max(len(line) for line in header_lines(raw)) <= limit
    assert not any(line.strip() == "" for line in header_lines(raw))  # no all-space line
    assert read_as_a_client(raw)["Subject"] == clean_text(subject)


def test_a_long_plain_name_and_a_long_extra_header_are_folded_too() -> None:
    name = " ".join(["Bartholomew"] * 16)  # 191 characters, ASCII, no specials
    url = "https://example.com/unsubscribe/" + "t" * 120
    message = make_message(
        name, headers=(("List-Unsubscribe", f"<mailto:u@example.com>, <{url}>"),)
    )
    raw = message.to_bytes()
    lines = header_lines(raw)
    assert max(len(line) for line in lines) <= 160  # the URL is one word: its own line
    parsed = message.to_email()
    (address,) = parsed["To"].addresses
    assert (address.display_name, address.addr_spec) == (name, "user42@example.com")
    assert parsed["List-Unsubscribe"] == f"<mailto:u@example.com>, <{url}>"
    with pytest.raises(ValueError):
        make_message("Ada", headers=(("X-Long", "z" * 1000),)).to_bytes()


async def test_a_1225_byte_ascii_subject_is_accepted_by_a_real_smtp_server(
    smtp_server: SmtpTestServer,
) -> None:
    message = make_message("Ada", subject=LONG_SUBJECT)
    mailer = from_url(smtp_server.url)
    try:
        await mailer.send(message)
    finally:
        await mailer.close()
    (received,) = smtp_server.wait_for_messages(1)
    assert max(len(line) for line in received.raw.split(b"\r\n")) <= 78
    assert read_as_a_client(received.raw)["Subject"] == LONG_SUBJECT

    # The same subject unfolded onto one line: the server refuses it.
    head, sep, body = message.to_bytes().partition(b"\r\n\r\n")
    unfolded = head.replace(b"\r\n ", b" ") + sep + body
    async with aiosmtplib.SMTP(hostname=HOST, port=smtp_server.port, timeout=10) as client:
        with pytest.raises(aiosmtplib.SMTPDataError) as info:
            await client.sendmail(message.envelope_sender, [message.to_addr], unfolded)
    assert info.value.code == 500

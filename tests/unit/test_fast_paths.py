"""Fast paths on the per-entity path give the same result as the general path they skip."""

from __future__ import annotations

import asyncio
import binascii
import gc
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from html import unescape

import aiosmtplib
import pytest

from batchrun.errors import MailConnectionError, PermanentMailError, TemporaryMailError
from batchrun.mail import Message, mime, smtp_transaction
from batchrun.mail.deadline import Deadlines
from batchrun.mail.smtp import SmtpMailer
from batchrun.pipeline import gctune

# -- SMTP PIPELINING (RFC 2920) ----------------------------------------------------------


@dataclass
class FakeServer:
    """A small SMTP server: offers PIPELINING or not, records every read and message, and
    answers MAIL / RCPT / DATA as told (``replies``), one reply per write when ``split``."""

    pipelining: bool = True
    split: bool = False
    replies: dict[bytes, bytes] = field(default_factory=dict)  # command -> reply line
    reads: list[bytes] = field(default_factory=list)
    commands: list[bytes] = field(default_factory=list)
    buffered: list[bytes] = field(default_factory=list)  # what was already read after each
    messages: list[bytes] = field(default_factory=list)
    sessions: int = 0
    port: int = 0
    server: asyncio.Server | None = None

    async def start(self) -> FakeServer:
        self.server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.sessions += 1
        writer.write(b"220 fake ESMTP\r\n")
        pending: list[bytes] = []
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                self.reads.append(line)
                self.buffered.append(bytes(reader._buffer))  # type: ignore[attr-defined]
                verb = line[:4].upper()
                self.commands.append(verb)
                if verb == b"EHLO":
                    extra = b"250-PIPELINING\r\n" if self.pipelining else b""
                    writer.write(b"250-fake\r\n" + extra + b"250 SIZE 100000\r\n")
                    continue
                if verb == b"QUIT":
                    writer.write(b"221 bye\r\n")
                    await writer.drain()
                    return
                default = {b"MAIL": b"250 ok", b"RCPT": b"250 ok", b"DATA": b"354 go on"}
                reply = self.replies.get(verb, default.get(verb, b"250 ok")) + b"\r\n"
                pending.append(reply)
                if self.split or verb not in (b"MAIL", b"RCPT") or not reader._buffer:  # type: ignore[attr-defined]
                    for one in pending:
                        writer.write(one)
                        if self.split:
                            await writer.drain()
                            await asyncio.sleep(0.01)
                    pending.clear()
                if reply.startswith(b"421"):
                    await writer.drain()
                    writer.close()
                    return
                if verb == b"DATA" and reply.startswith(b"354"):
                    body = await reader.readuntil(b"\r\n.\r\n")
                    self.messages.append(body[: -len(b".\r\n")])
                    writer.write(b"250 queued\r\n")
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = await FakeServer().start()
    yield server
    await server.stop()


async def _client(port: int) -> aiosmtplib.SMTP:
    client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False)
    await client.connect()
    await client.ehlo()
    return client


def _message(n: int, **overrides: str) -> Message:
    fields = {
        "sender": "Birthday Team <birthday@example.com>",
        "to_addr": f"user{n}@example.com",
        "to_name": "User",
        "subject": "Happy birthday",
        "text": "Your gift code: ABCD-EFGH\n",
        "html": "",
        "message_id": f"<birthday.2025.{n}@example.com>",
    }
    fields.update(overrides)
    return Message(**fields)


MESSAGES = [
    _message(1),  # ASCII
    _message(2, to_name="Zoë Ünïcode", subject="Joyeux anniversaire, Zoë 🎂", text="Café ✓\n"),
    _message(3, text="x" * 2000 + "\n" + "word " * 400 + "\n", html="<p>" + "y" * 3000),
    _message(4, text=".leading dot\n..two dots\n.\nlast"),
]


@pytest.mark.parametrize("split", [False, True], ids=["one-write-replies", "split-replies"])
async def test_pipelined_messages_arrive_as_the_sequential_path_sends_them(split: bool) -> None:
    received: dict[bool, list[bytes]] = {}
    raws = [(m.envelope_sender, m.envelope_to, m.to_bytes()) for m in MESSAGES]
    for pipelining in (False, True):
        server = await FakeServer(pipelining=pipelining, split=split).start()
        client = await _client(server.port)
        try:
            for sender, rcpt, raw in raws:
                await smtp_transaction.transaction(client, sender, rcpt, raw)
        finally:
            await client.quit()
            await server.stop()
        received[pipelining] = server.messages
        envelope = [r for r in server.reads if r.startswith((b"MAIL", b"RCPT", b"DATA"))]
        assert len(envelope) == 3 * len(MESSAGES)
    assert received[True] == received[False]
    assert len(received[True]) == len(MESSAGES)
    assert received[True][3].count(b"\r\n..leading dot\r\n...two dots\r\n..\r\n") == 1


async def test_the_envelope_goes_out_in_one_write_when_the_server_pipelines(
    fake: FakeServer,
) -> None:
    fake.split = True  # each reply alone: the commands cannot have waited for one
    client = await _client(fake.port)
    try:
        await smtp_transaction.transaction(client, "a@example.com", "b@example.com", b"S: x\r\n")
    finally:
        await client.quit()
    # When the server read MAIL, RCPT and DATA had already arrived with it.
    assert fake.commands[:4] == [b"EHLO", b"MAIL", b"RCPT", b"DATA"]
    assert fake.buffered[1] == b"RCPT TO:<b@example.com>\r\nDATA\r\n"
    assert fake.messages == [b"S: x\r\n"]


@pytest.mark.parametrize(
    ("verb", "reply", "error"),
    [
        (b"MAIL", b"451 4.3.0 later", TemporaryMailError),
        (b"RCPT", b"550 5.1.1 no such user", PermanentMailError),
        (b"DATA", b"554 5.5.1 no valid recipients", PermanentMailError),
    ],
)
@pytest.mark.parametrize("split", [False, True])
async def test_a_refused_command_is_classified_and_the_connection_stays_in_step(
    fake: FakeServer, verb: bytes, reply: bytes, error: type[Exception], split: bool
) -> None:
    fake.split = split
    fake.replies = {verb: reply}
    if verb != b"DATA":
        fake.replies[b"DATA"] = b"503 5.5.1 no valid transaction"
    mailer = SmtpMailer("127.0.0.1", fake.port, start_tls=False, timeout=5)
    try:
        with pytest.raises(error):
            await mailer.send(_message(1))
        fake.replies = {}
        await mailer.send(_message(2))  # the same session, after RSET
    finally:
        await mailer.close()
    assert fake.sessions == 1
    assert b"RSET" in fake.commands
    assert len(fake.messages) == 1 and b"<birthday.2025.2@example.com>" in fake.messages[0]


async def test_a_421_mid_group_closes_the_session_and_the_next_send_reconnects(
    fake: FakeServer,
) -> None:
    fake.replies = {b"RCPT": b"421 4.3.2 shutting down"}
    mailer = SmtpMailer("127.0.0.1", fake.port, start_tls=False, timeout=5)
    try:
        with pytest.raises(MailConnectionError):
            await mailer.send(_message(1))
        fake.replies = {}
        await mailer.send(_message(2))
    finally:
        await mailer.close()
    assert fake.sessions == 2
    assert len(fake.messages) == 1


async def test_data_opened_for_a_refused_recipient_closes_the_session(fake: FakeServer) -> None:
    # A broken server says 354 though it refused the recipient: nothing is sent, and the
    # session, which could only be left by sending a message, is replaced.
    fake.replies = {b"RCPT": b"550 5.1.1 no such user"}
    mailer = SmtpMailer("127.0.0.1", fake.port, start_tls=False, timeout=5)
    try:
        with pytest.raises(PermanentMailError):
            await mailer.send(_message(1))
        fake.replies = {}
        await mailer.send(_message(2))
    finally:
        await mailer.close()
    assert fake.sessions == 2
    assert len(fake.messages) == 1 and b"<birthday.2025.2@example.com>" in fake.messages[0]


# -- the collector's threshold while entities travel ------------------------------------


def test_the_collector_threshold_is_raised_while_travelling_and_restored_after() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with gctune.fewer_collections():
            assert gc.get_threshold() == (gctune.RUN_THRESHOLD, 10, 10)
            with gctune.fewer_collections():  # a second travel at once
                assert gc.get_threshold()[0] == gctune.RUN_THRESHOLD
            assert gc.get_threshold()[0] == gctune.RUN_THRESHOLD  # the first still runs
        assert gc.get_threshold() == (700, 10, 10)
        with pytest.raises(RuntimeError), gctune.fewer_collections():
            raise RuntimeError("a travel that fails restores it too")
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0)  # the application turned collection off: it stays off
        with gctune.fewer_collections():
            assert gc.get_threshold()[0] == 0
        gc.set_threshold(50000, 20, 20)  # already higher: left as it is
        with gctune.fewer_collections():
            assert gc.get_threshold() == (50000, 20, 20)
    finally:
        gc.set_threshold(*before)


# -- the 7bit check: long lines found by searching back, CRLF made on bytes ---------------


def _long_line_by_split(text: str) -> bool:
    return max(map(len, text.split("\n"))) > mime.MAX_LINE


def _text_body_general(text: str) -> tuple[str, bytes]:
    """The general path: every line measured, CRLF made on the str."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.isascii() and "\0" not in text and not _long_line_by_split(text):
        return "7bit", text.replace("\n", "\r\n").encode("ascii")
    encoded = binascii.b2a_qp(text.encode("utf-8"), istext=True)
    return "quoted-printable", encoded.replace(b"\n", b"\r\n")


def test_the_long_line_check_agrees_with_measuring_every_line() -> None:
    rng = random.Random(7)
    texts = [
        "x" * n + "\n" + "y" * m
        for n in (0, 497, 498, 499, 500, 997, 998, 999, 1000, 1500)
        for m in (0, 1, 498, 998, 999, 2000)
    ]
    texts += ["\n" * 3000, "a\n" * 1500, ("z" * 998 + "\n") * 5, ("z" * 998 + "\n") * 5 + "z" * 999]
    for _ in range(3000):
        lines = [
            rng.choice("ab.") * rng.choice((0, 1, 200, 498, 499, 500, 997, 998, 999))
            for _ in range(rng.randint(1, 8))
        ]
        texts.append("\n".join(lines))
    for text in texts:
        assert mime._long_line(text) == _long_line_by_split(text), text[:40]


@pytest.mark.parametrize(
    "text",
    [
        "Happy birthday, Grace!\nYour code: ABCD-EFGH\n",  # ASCII: 7bit
        "Joyeux anniversaire, Zoë 🎂\nCafé ✓\n",  # non-ASCII: quoted-printable
        "x" * 998 + "\n" + "y" * 998,  # the longest lines 7bit allows
        "x" * 999 + "\nshort\n",  # one line too long: quoted-printable
        ("word " * 300 + "\n") * 3,  # 1500-character lines
        ".leading dot\n..two\n.\nlast",  # dots are the transaction's to stuff, not here
        "CR LF\r\nand a lone CR\rand NUL \0 end\n",
        "<p>" + "<td>cell</td>\n" * 400 + "</p>",  # a long HTML body of short lines
    ],
)
def test_text_body_gives_the_general_paths_bytes(text: str) -> None:
    assert mime.text_body(text) == _text_body_general(text)


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("<p>plain</p>", "<p>plain</p>"),
        ("<p>Zoë 🎂</p>", "<p>Zo&#235; &#127874;</p>"),
        (
            '<a href="https://example.com/café">Café</a>',
            '<a href="https://example.com/caf&#233;">Caf&#233;</a>',
        ),
        # An element whose text is not read for references: the whole part is left as it
        # is (quoted-printable), closed or not, in any case, however it ends.
        ("<style>p::after{content:'é'}</style><p>é</p>", None),
        ("<STYLE>p{color:red}</STYLE><p>é</p>", None),
        ("<p>x</p><style>p::after{content:'é'}", None),
        ("<style>p::after{content:'é'}</style/><p>x</p>", None),
        ("<!--<script>--><style></script>é</style>", None),
        ("<Script >var a = 'é';</script ><p>x</p>", None),
        ("<p>x</p><PLAINTEXT>é, to the end", None),
        ("<noscript>é</noscript>", None),
        # Characters a reference would not carry: C1 controls (read as Windows-1252) and
        # a lone surrogate (no character at all)
        ("<p>é\x80</p>", None),
        ("<p>é\x9f</p>", None),
        ("<p>é\ud83d</p>", None),
    ],
)
def test_ascii_html_writes_non_ascii_as_references_outside_raw_text(
    html: str, expected: str | None
) -> None:
    got = mime.ascii_html(html)
    assert got == (html if expected is None else expected)
    assert unescape(got) == html


# -- one timer for every send's deadline -------------------------------------------------


async def test_an_overdue_send_times_out_as_under_asyncio_timeout() -> None:
    deadlines = Deadlines(0.2)
    started = time.monotonic()
    with pytest.raises(TimeoutError), deadlines.bound():
        await asyncio.sleep(5)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 0.2 + deadlines.tick + 0.5
    assert deadlines._timer is None and not deadlines._due  # nothing left armed
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # its own cancel was taken back


async def test_only_the_overdue_send_is_cut_short() -> None:
    deadlines = Deadlines(0.3)

    async def send(seconds: float) -> str:
        with deadlines.bound():
            await asyncio.sleep(seconds)
        return "sent"

    quick = [asyncio.create_task(send(0.05)) for _ in range(20)]
    slow = asyncio.create_task(send(5))
    assert await asyncio.gather(*quick) == ["sent"] * 20
    with pytest.raises(TimeoutError):
        await slow


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    deadlines = Deadlines(5)
    entered = asyncio.Event()

    async def send() -> None:
        with deadlines.bound():
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(send())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines._timer is None


async def test_a_send_that_finishes_in_time_is_untouched() -> None:
    deadlines = Deadlines(0.05)  # ticks every 10 ms
    for _ in range(5):
        with deadlines.bound():
            await asyncio.sleep(0.01)
    assert deadlines._timer is None and not deadlines._expired

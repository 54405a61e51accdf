"""A real SMTP server for tests: aiosmtpd on a free loopback port, in its own thread.

It records what it receives, counts client connections, and can be slowed down or made to
fail on demand, at any time, from the test's thread::

    from support.smtp_server import SmtpTestServer, fail_first

    @pytest.fixture(scope="session")
    def smtp_server_session():
        with SmtpTestServer() as server:   # start() ... stop()
            yield server

    @pytest.fixture
    def smtp_server(smtp_server_session):
        smtp_server_session.reset()        # clean messages, counters, policy, latency
        return smtp_server_session

    @pytest.fixture
    def make_smtp_server():
        servers = []
        def make(**kwargs):                # policy=..., policy_stage=..., latency=...
            server = SmtpTestServer(**kwargs).start()
            servers.append(server)
            return server
        yield make
        for server in servers:
            server.stop()

    async def test_retry_after_451(smtp_server):
        smtp_server.set_policy(fail_first(2, "451 4.3.0 Try again later"))
        mailer = from_url(smtp_server.url)           # smtp://127.0.0.1:PORT
        ...
        smtp_server.set_policy(None)                 # the server "recovers"
        smtp_server.wait_for_messages(1)
        assert smtp_server.message_ids() == ["<birthday.2025.42@example.com>"]

Import it as ``from support.smtp_server import ...``: pytest's default import mode puts ``tests/``
on ``sys.path`` (there is no ``tests/__init__.py``).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, Literal, Self, cast

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import MISSING, SMTP, Envelope, Session

# (recipient, transaction number starting at 1) -> None to accept, or a reply such as
# "451 4.3.0 Try again later" / "550 5.1.1 No such user".
FailurePolicy = Callable[[str, int], str | None]
Stage = Literal["rcpt", "data"]

HOST = "127.0.0.1"


def fail_first(count: int, reply: str) -> FailurePolicy:
    """Return a policy that answers ``reply`` to the first ``count`` transactions."""
    return lambda _rcpt, number: reply if number <= count else None


def fail_recipients(replies: dict[str, str]) -> FailurePolicy:
    """Return a policy that answers each listed recipient with its reply, always."""
    return lambda rcpt, _number: replies.get(rcpt)


@dataclass(frozen=True)
class ReceivedMessage:
    """One message the server accepted."""

    mail_from: str
    recipients: list[str]
    raw: bytes
    message_id: str | None
    email: EmailMessage = field(repr=False)
    mail_options: tuple[str, ...] = ()  # MAIL FROM parameters, e.g. ("SMTPUTF8",)


class _Recorder:
    """State shared by the server thread and the test thread, behind one lock."""

    def __init__(
        self, policy: FailurePolicy | None, stage: Stage, latency: float, connect_latency: float
    ) -> None:
        self.cond = threading.Condition()
        self.policy = policy
        self.stage: Stage = stage
        self.latency = latency
        self.connect_latency = connect_latency
        self.messages: list[ReceivedMessage] = []
        self.transactions = 0
        self.rejected = 0
        self.connections_opened = 0
        self.open_connections = 0
        self.max_open_connections = 0
        self.live: set[_CountingSMTP] = set()  # every connected session, counted or not

    def reset(self) -> None:
        with self.cond:
            self.policy = None
            self.stage = "rcpt"
            self.latency = 0.0
            self.connect_latency = 0.0
            self.messages.clear()
            self.transactions = 0
            self.rejected = 0
            self.connections_opened = 0
            self.max_open_connections = self.open_connections
            self.cond.notify_all()


class _CountingSMTP(SMTP):
    """aiosmtpd's SMTP, counting client sessions (those that say EHLO or HELO).

    Counting at EHLO rather than at accept leaves out the probe connection that
    ``Controller.start()`` makes to check the server is up.
    """

    def __init__(self, handler: _Handler, recorder: _Recorder, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._recorder = recorder
        self._counted = False

    def count_session(self) -> None:
        if self._counted:
            return
        self._counted = True
        with self._recorder.cond:
            rec = self._recorder
            rec.connections_opened += 1
            rec.open_connections += 1
            rec.max_open_connections = max(rec.max_open_connections, rec.open_connections)
            rec.cond.notify_all()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        with self._recorder.cond:
            self._recorder.live.add(self)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        with self._recorder.cond:
            self._recorder.live.discard(self)
            if self._counted:
                self._recorder.open_connections -= 1
            self._recorder.cond.notify_all()
        super().connection_lost(error)

    def abort(self) -> None:
        """Drop this client's connection (from the server's loop)."""
        if self.transport is not None:
            self.transport.close()


class _Handler:
    """aiosmtpd hooks: count sessions, apply latency and the failure policy, record."""

    def __init__(self, recorder: _Recorder) -> None:
        self.rec = recorder

    async def _session_start(self, server: SMTP) -> None:
        cast(_CountingSMTP, server).count_session()
        with self.rec.cond:
            delay = self.rec.connect_latency
        if delay > 0:
            await asyncio.sleep(delay)

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        await self._session_start(server)
        session.host_name = hostname
        return responses

    async def handle_HELO(
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str
    ) -> object:
        await self._session_start(server)
        return MISSING

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        with self.rec.cond:
            self.rec.transactions += 1
            number = self.rec.transactions
            policy, stage = self.rec.policy, self.rec.stage
        # The policy is the test's code: call it outside the lock.
        reply = policy(address, number) if policy is not None and stage == "rcpt" else None
        if reply is not None:
            self._count_rejection()
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        # Remember the number so the DATA stage can pass the same one to the policy.
        cast(Any, envelope).batchrun_number = number
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        with self.rec.cond:
            delay = self.rec.latency
            policy, stage = self.rec.policy, self.rec.stage
        if delay > 0:
            await asyncio.sleep(delay)
        if policy is not None and stage == "data":
            number = getattr(envelope, "batchrun_number", 0)
            reply = policy(envelope.rcpt_tos[0] if envelope.rcpt_tos else "", number)
            if reply is not None:
                self._count_rejection()
                return reply
        raw = envelope.original_content or b""
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        message = ReceivedMessage(
            mail_from=envelope.mail_from or "",
            recipients=list(envelope.rcpt_tos),
            raw=raw,
            message_id=str(parsed["Message-ID"]) if parsed["Message-ID"] is not None else None,
            email=parsed,
            mail_options=tuple(envelope.mail_options),
        )
        with self.rec.cond:
            self.rec.messages.append(message)
            self.rec.cond.notify_all()
        return "250 Message accepted"

    def _count_rejection(self) -> None:
        with self.rec.cond:
            self.rec.rejected += 1


class _Controller(Controller):
    """A Controller on a socket bound before start, so the port is free and known."""

    def __init__(
        self, handler: _Handler, recorder: _Recorder, sock: socket.socket, *, smtputf8: bool
    ) -> None:
        super().__init__(
            handler,
            hostname=HOST,
            port=sock.getsockname()[1],
            server_hostname="localhost",  # skips a slow getfqdn() in each session
            ready_timeout=10.0,
            enable_SMTPUTF8=smtputf8,
        )
        self._recorder = recorder
        self._sock = sock

    def factory(self) -> SMTP:
        return _CountingSMTP(self.handler, self._recorder, **self.SMTP_kwargs)

    def _create_server(self) -> Awaitable[asyncio.AbstractServer]:
        # asyncio listens again with a backlog of 100 unless told: a run opening more
        # connections at once would have SYNs dropped and retried a second later.
        return self.loop.create_server(self._factory_invoker, sock=self._sock, backlog=1024)


class SmtpTestServer:
    """A real SMTP server on 127.0.0.1 and a free port, for integration tests.

    Every public method is safe to call from any thread while the server runs.
    """

    def __init__(
        self,
        *,
        policy: FailurePolicy | None = None,
        policy_stage: Stage = "rcpt",
        latency: float = 0.0,
        connect_latency: float = 0.0,
        smtputf8: bool = False,
    ) -> None:
        """Configure the server; ``start()`` opens the port.

        Args:
            policy: decides each transaction's fate; None accepts everything.
            policy_stage: answer the policy's reply to RCPT TO or to the end of DATA.
            latency: seconds to wait before answering the end of DATA (a slow server).
            connect_latency: seconds to wait before answering EHLO/HELO.
            smtputf8: offer SMTPUTF8 (RFC 6531) in the EHLO reply.
        """
        self._rec = _Recorder(policy, policy_stage, latency, connect_latency)
        self._smtputf8 = smtputf8
        self._controller: _Controller | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self, port: int = 0) -> Self:
        """Bind ``port`` (0: a free one) and serve in a background thread; returns self."""
        if self._controller is not None:
            raise RuntimeError("SmtpTestServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, port))
            sock.listen(128)
            sock.setblocking(False)
            controller = _Controller(_Handler(self._rec), self._rec, sock, smtputf8=self._smtputf8)
            controller.start()
        except BaseException:
            sock.close()
            raise
        self._controller = controller
        self.port = sock.getsockname()[1]
        return self

    def stop(self) -> None:
        """Drop every client connection, stop the thread and close the port."""
        controller, self._controller = self._controller, None
        if controller is None:
            return
        # Stop accepting, then close client transports, so nothing is left for the
        # garbage collector to find open (a ResourceWarning would fail a test under
        # filterwarnings=error): a client that reconnected between the two would be.
        future = asyncio.run_coroutine_threadsafe(self._close(controller), controller.loop)
        future.result(timeout=10)
        controller.stop()

    async def _close(self, controller: Controller) -> None:
        if controller.server is not None:
            controller.server.close()
        await self._drop_clients()

    async def _drop_clients(self) -> None:
        with self._rec.cond:
            live = list(self._rec.live)
        for session in live:
            session.abort()
        # Let connection_lost run for each before the loop stops.
        for _ in range(100):
            with self._rec.cond:
                if not self._rec.live:
                    return
            await asyncio.sleep(0.01)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The ``--mail`` URL for this server, e.g. ``smtp://127.0.0.1:40123``."""
        return f"smtp://{HOST}:{self.port}"

    # -- behaviour, changeable at runtime --------------------------------------------

    def set_policy(self, policy: FailurePolicy | None, stage: Stage = "rcpt") -> None:
        """Replace the failure policy (None accepts everything) and where it answers."""
        with self._rec.cond:
            self._rec.policy = policy
            self._rec.stage = stage

    def set_latency(self, seconds: float, *, connect: float | None = None) -> None:
        """Delay each DATA reply (and, if given, each EHLO reply) by this many seconds."""
        with self._rec.cond:
            self._rec.latency = seconds
            if connect is not None:
                self._rec.connect_latency = connect

    def reset(self) -> None:
        """Drop client connections, forget messages and counters, accept everything again.

        Dropping first makes counts exact for the next test: no session of an earlier
        test (say, one still sleeping in an injected latency) is left to be counted.
        """
        self.drop_connections()
        self._rec.reset()

    def drop_connections(self) -> None:
        """Close every client connection from the server side (a server restart)."""
        controller = self._controller
        if controller is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._drop_clients(), controller.loop)
        future.result(timeout=10)

    # -- observations ------------------------------------------------------------------

    @property
    def messages(self) -> list[ReceivedMessage]:
        """A copy of the messages accepted so far, in arrival order."""
        with self._rec.cond:
            return list(self._rec.messages)

    def message_ids(self) -> list[str | None]:
        """The Message-ID of each accepted message, in arrival order."""
        return [message.message_id for message in self.messages]

    def sends_per_user(self, year: int | None = None) -> Counter[int]:
        """Accepted messages by user id, read from batchrun's stable Message-ID
        ``<job.year.user@domain>``; only ``year``'s when given."""
        counts: Counter[int] = Counter()
        for message_id in self.message_ids():
            assert message_id is not None, "a message without a Message-ID"
            _, message_year, uid = message_id.strip("<>").split("@")[0].split(".")
            if year is None or int(message_year) == year:
                counts[int(uid)] += 1
        return counts

    @property
    def transactions(self) -> int:
        """How many RCPT TO commands the server has seen (accepted or not)."""
        with self._rec.cond:
            return self._rec.transactions

    @property
    def rejected(self) -> int:
        """How many transactions the policy failed."""
        with self._rec.cond:
            return self._rec.rejected

    @property
    def connections_opened(self) -> int:
        """How many client sessions have started since start() or reset()."""
        with self._rec.cond:
            return self._rec.connections_opened

    @property
    def open_connections(self) -> int:
        """How many client sessions are open now."""
        with self._rec.cond:
            return self._rec.open_connections

    @property
    def max_open_connections(self) -> int:
        """The most client sessions that were open at the same time."""
        with self._rec.cond:
            return self._rec.max_open_connections

    def wait_for_messages(self, count: int, timeout: float = 10.0) -> list[ReceivedMessage]:
        """Block until at least ``count`` messages arrived; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._rec.cond:
            while len(self._rec.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"expected {count} messages, got {len(self._rec.messages)}")
                self._rec.cond.wait(left)
            return list(self._rec.messages)

    def wait_for_open_connections(self, count: int, timeout: float = 10.0) -> None:
        """Block until exactly ``count`` client sessions are open (e.g. 0 after close)."""
        deadline = time.monotonic() + timeout
        with self._rec.cond:
            while self._rec.open_connections != count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"expected {count} open connections, got {self._rec.open_connections}"
                    )
                self._rec.cond.wait(left)

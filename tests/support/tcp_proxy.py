"""A TCP proxy on loopback for fault tests: asyncio in its own thread, in front of a server.

It forwards bytes both ways, and on demand loses a reply: the client's bytes that contain
a marker are forwarded to the server (so the statement runs, and commits), and the
server's next reply on that connection is dropped and both sides closed, the way a
network that fails at the worst moment does. Or it closes a connection before a marked
statement reaches the server, or every connection at once::

    from support.tcp_proxy import TcpProxy

    with TcpProxy("127.0.0.1", 3306) as proxy:          # start() ... stop()
        url = proxy.url_for("mysql://root:@127.0.0.1:3306/db")   # the proxy's port
        proxy.drop_reply(b"balance = balance + 10")     # the next such statement's reply
        proxy.drop_reply(b"SET state", reply_contains=b"UPDATE", times=2)
        proxy.close_before(b"INSERT INTO account")      # never reaches the server
        proxy.drop_reply(b"batchrun_ledger", chance=0.05, times=20, seed=7)   # at random
        proxy.silence(b"batchrun_ledger")               # no reply, ever; still connected
        proxy.close_all()                               # every connection, now
        assert proxy.dropped == 1

It speaks no protocol: markers are plain bytes of the statement's text (MySQL's COM_QUERY
carries it whole; PostgreSQL's Parse message does, the first time a connection prepares
the statement). ``reply_contains`` picks which reply is dropped when the first one after
the marker is not the statement's result: asyncpg prepares (Parse, Describe), then runs
(Bind, Execute), and only the second reply holds the command tag (``UPDATE 1``).

Import it as ``from support.tcp_proxy import TcpProxy`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass
from typing import Self
from urllib.parse import urlsplit, urlunsplit

HOST = "127.0.0.1"
CHUNK = 65536


@dataclass
class _Rule:
    marker: bytes
    times: int
    reply_contains: bytes | None = None
    before: bool = False  # close before forwarding (the statement never reaches the server)
    silent: bool = False  # keep the connection open and forward nothing back, ever
    chance: float = 1.0  # the share of matching statements the rule hits


@dataclass(eq=False)  # hashed by identity: one per connection
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    armed: bytes | None = None  # drop the next server chunk containing this (b"": any)
    silent: bool = False  # the server's replies are swallowed; the connection stays open


class TcpProxy:
    """Forwards 127.0.0.1:port to (host, upstream_port); loses replies when told to."""

    def __init__(self, host: str, upstream_port: int) -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.port = 0
        self.dropped = 0  # replies dropped
        self.closed_before = 0  # statements cut off before the server saw them
        self.silenced = 0  # connections silenced
        self.connections = 0  # client connections accepted
        self._rules: list[_Rule] = []
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._rng = random.Random(0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url_for(self, url: str) -> str:
        """``url`` with its host and port made the proxy's (user, password, path kept)."""
        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@{HOST}:{self.port}" if auth else f"{HOST}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- faults, from the test's thread ---------------------------------------------------

    def drop_reply(
        self,
        marker: bytes,
        *,
        reply_contains: bytes | None = None,
        times: int = 1,
        chance: float = 1.0,
        seed: int | None = None,
    ) -> None:
        """The next ``times`` statements containing ``marker`` reach the server; the reply
        to each (the first server chunk after it, or after it containing
        ``reply_contains``) is dropped and its connection closed both ways. With
        ``chance`` below 1, only that share of the matching statements, at random
        (``seed`` replays the choices)."""
        with self._lock:
            if seed is not None:
                self._rng.seed(seed)
            self._rules.append(_Rule(marker, times, reply_contains, chance=chance))

    def close_before(self, marker: bytes, *, times: int = 1) -> None:
        """The next ``times`` statements containing ``marker`` never reach the server:
        their connections are closed instead."""
        with self._lock:
            self._rules.append(_Rule(marker, times, before=True))

    def silence(self, marker: bytes, *, times: int = 1) -> None:
        """The next ``times`` statements containing ``marker`` reach the server, and from
        then on nothing the server sends on their connections reaches the client, which
        stays connected: a network that blackholes packets (a partition, a failover whose
        old primary vanished) rather than resetting the connection. Only ``close_all``
        or ``stop`` ends such a connection."""
        with self._lock:
            self._rules.append(_Rule(marker, times, silent=True))

    def clear(self) -> None:
        """Forget every rule not used up yet."""
        with self._lock:
            self._rules.clear()

    def close_all(self) -> None:
        """Close every connection through the proxy now (new ones are still accepted)."""
        loop = self._loop
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(10)

    # -- the proxy --------------------------------------------------------------------------

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._server = loop.run_until_complete(asyncio.start_server(self._accept, HOST, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for link in list(self._links):
                _close(link)
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _close_all(self) -> None:
        for link in list(self._links):
            _close(link)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.close()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._client_to_server(reader, link), self._server_to_client(up_reader, link)
            )
        finally:
            self._links.discard(link)
            _close(link)

    def _rule_for(self, data: bytes) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.times > 0 and rule.marker in data:
                    if rule.chance < 1.0 and self._rng.random() >= rule.chance:
                        continue
                    rule.times -= 1
                    return rule
        return None

    async def _client_to_server(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(CHUNK):
                rule = self._rule_for(data)
                if rule is not None and rule.before:
                    self.closed_before += 1
                    _close(link)
                    return
                if rule is not None and rule.silent:
                    link.silent = True
                    self.silenced += 1
                elif rule is not None:
                    link.armed = rule.reply_contains or b""
                link.server.write(data)
                await link.server.drain()
        _close(link)

    async def _server_to_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(CHUNK):
                if link.silent:
                    continue  # heard by no one
                armed = link.armed
                if armed is not None and armed in data:
                    self.dropped += 1  # the server answered; the client never hears it
                    _close(link)
                    return
                link.client.write(data)
                await link.client.drain()
        _close(link)


def _close(link: _Link) -> None:
    for writer in (link.client, link.server):
        with contextlib.suppress(Exception):
            writer.transport.abort()

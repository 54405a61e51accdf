"""An SMTP sink for the benchmark: accepts every message after a set latency, counts it.

Run as its own process (``python -m bench.smtp_sink --latency-ms 20``) so its CPU never
shares a GIL with the sender under test. It prints one JSON line ``{"port": P}`` when it
listens, then answers commands read from stdin, one per line, with one JSON line each:

- ``stats``: ``messages, rejected, connections, open, max_open, cpu_s``
- ``reset``: zero the counters (answers the stats before the reset)

It exits when stdin closes. The latency is a delay before the reply to the end of DATA,
as in ``tests/support/smtp_server.py``; the body is never parsed. Two implementations:

- ``fast`` (default): a minimal SMTP protocol on ``asyncio.Protocol`` (EHLO/HELO, MAIL,
  RCPT, DATA, RSET, NOOP, QUIT), the reply delayed with ``loop.call_later``; about 10x
  less CPU per message than aiosmtpd.
- ``aiosmtpd``: aiosmtpd's SMTP with an ``asyncio.sleep`` in ``handle_DATA``, like the test
  server. It costs about 0.45 ms of CPU per message, so on one core it tops out near
  2,200 messages/s and becomes the bottleneck of any fast sender: kept for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, cast

from aiosmtpd.smtp import SMTP, Envelope, Session


@dataclass
class Counters:
    """What the sink saw since the last reset."""

    messages: int = 0
    rejected: int = 0
    bytes: int = 0
    connections: int = 0
    open: int = 0
    max_open: int = 0


class Handler:
    """aiosmtpd hooks: delay and count each message; refuse addresses with no domain."""

    def __init__(self, counters: Counters, latency_s: float) -> None:
        self.counters = counters
        self.latency_s = latency_s

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        local, _, domain = address.rpartition("@")
        if not local or not domain:
            self.counters.rejected += 1
            return "550 5.1.3 Bad recipient address syntax"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        self.counters.messages += 1
        self.counters.bytes += len(envelope.original_content or b"")
        return "250 Message accepted"


class CountingSMTP(SMTP):
    """aiosmtpd's SMTP session, counting connections."""

    def __init__(self, handler: Handler, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._counters = handler.counters

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        c = self._counters
        c.connections += 1
        c.open += 1
        c.max_open = max(c.max_open, c.open)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self._counters.open -= 1
        super().connection_lost(error)


_EHLO = b"250-localhost\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 33554432\r\n"
_END_OF_DATA = b"\r\n.\r\n"


class FastSMTP(asyncio.Protocol):
    """Just enough server-side SMTP for aiosmtplib; no parsing of the message."""

    def __init__(self, counters: Counters, latency_s: float) -> None:
        self.counters = counters
        self.latency_s = latency_s
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.in_data = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        c = self.counters
        c.connections += 1
        c.open += 1
        c.max_open = max(c.max_open, c.open)
        self.transport.write(b"220 localhost bench-sink ESMTP\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        self.counters.open -= 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer and self.transport is not None:
            if self.in_data:
                # DATA began right after a CRLF, so an empty body ends with ".\r\n".
                if self.buffer.startswith(b".\r\n"):
                    end, skip = 0, 3
                else:
                    end, skip = self.buffer.find(_END_OF_DATA), 5
                    if end < 0:
                        return
                self.counters.messages += 1
                self.counters.bytes += end
                del self.buffer[: end + skip]
                self.in_data = False
                if self.latency_s > 0:
                    self.loop.call_later(self.latency_s, self._reply, b"250 OK queued\r\n")
                else:
                    self._reply(b"250 OK queued\r\n")
                continue
            end = self.buffer.find(b"\n")
            if end < 0:
                return
            line = bytes(self.buffer[:end]).rstrip(b"\r")
            del self.buffer[: end + 1]
            self._command(line)

    def _reply(self, reply: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)

    def _command(self, line: bytes) -> None:
        verb = line[:4].upper()
        if verb == b"EHLO":
            self._reply(_EHLO)
        elif verb in (b"HELO", b"MAIL", b"RSET", b"NOOP"):
            self._reply(b"250 OK\r\n")
        elif verb == b"RCPT":
            address = line.partition(b"<")[2].partition(b">")[0]
            local, _, domain = address.rpartition(b"@")
            if local and domain:
                self._reply(b"250 OK\r\n")
            else:
                self.counters.rejected += 1
                self._reply(b"550 5.1.3 Bad recipient address syntax\r\n")
        elif verb == b"DATA":
            self.in_data = True
            self._reply(b"354 End data with <CR><LF>.<CR><LF>\r\n")
        elif verb == b"QUIT":
            self._reply(b"221 Bye\r\n")
            if self.transport is not None:
                self.transport.close()
        else:
            self._reply(b"502 5.5.2 Command not implemented\r\n")


async def serve(host: str, port: int, latency_s: float, impl: str = "fast") -> None:
    """Listen, print the port, answer stdin commands until stdin closes."""
    counters = Counters()
    handler = Handler(counters, latency_s)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)

    def factory() -> asyncio.BaseProtocol:
        if impl == "aiosmtpd":
            return CountingSMTP(handler, hostname="localhost", ident="bench-sink")
        return FastSMTP(counters, latency_s)

    # create_server listens again with its own backlog (100 by default): 200 clients
    # connecting at once would overflow it, and a dropped SYN is retried only after 1 s.
    server = await loop.create_server(factory, sock=sock, backlog=4096)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with server:
        while line := await reader.readline():
            command = line.decode().strip()
            stats = {**asdict(counters), "cpu_s": round(time.process_time(), 3)}
            if command == "reset":
                fresh = Counters(open=counters.open, max_open=counters.open)
                for key, value in asdict(fresh).items():
                    setattr(counters, key, value)
            elif command != "stats":
                stats = {"error": f"unknown command {command!r}"}
            print(json.dumps(stats), flush=True)


def main() -> None:
    """Parse options and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--impl", choices=("fast", "aiosmtpd"), default="fast")
    parser.add_argument("--uvloop", action="store_true", help="use uvloop if installed")
    args = parser.parse_args()
    if args.uvloop:
        try:
            import uvloop  # type: ignore[import-not-found]

            uvloop.install()
        except ImportError:
            print("uvloop not installed; using asyncio's loop", file=sys.stderr)
    asyncio.run(serve(args.host, args.port, args.latency_ms / 1000, args.impl))


if __name__ == "__main__":
    main()

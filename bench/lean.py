"""The lean sender: raw SMTP over asyncio streams, the least a plain sender does per message.

C persistent connections (``asyncio.open_connection``, no SMTP library), each sending
MAIL, RCPT, DATA and the body with its final ``.``, one after another, and reading every
reply before the next command (no pipelining). The messages are the birthday job's
(``bench.ceiling.sample_messages``: its template, full HTML layout), built and turned into
the bytes of each command before the clock starts; no database, no deadline, no address
check. ``python -m bench.lean --port P --concurrency 50 --messages N`` prints one JSON
object on stdout, like ``bench/ceiling.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

SENDER = b"birthday@localhost"


class ReplyError(Exception):
    """The server answered a command with an unexpected code."""


def transactions(count: int, shape: str) -> list[tuple[bytes, bytes, bytes]]:
    """(MAIL, RCPT, body) command bytes for up to 256 distinct messages, sent round robin;
    the body is dot-stuffed and ends with the final ``.``."""
    from bench.ceiling import sample_messages  # batchrun's message code, off the clock

    out = []
    for rcpt, raw in sample_messages(min(count, 256), shape):
        body = raw if raw.endswith(b"\r\n") else raw + b"\r\n"
        body = b"." + body if body.startswith(b".") else body
        mail = b"MAIL FROM:<%s>\r\n" % SENDER
        out.append(
            (
                mail,
                b"RCPT TO:<%s>\r\n" % rcpt.encode(),
                body.replace(b"\r\n.", b"\r\n..") + b".\r\n",
            )
        )
    return out


async def reply(reader: asyncio.StreamReader, code: bytes) -> None:
    """Read one reply (all its lines); raise ReplyError unless it starts with ``code``."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("the server closed the connection")
        if line[3:4] != b"-":  # "250-..." continues, "250 ..." ends the reply
            break
    if not line.startswith(code):
        raise ReplyError(line.decode(errors="replace").strip())


async def run(host: str, port: int, messages: int, concurrency: int, shape: str) -> dict[str, Any]:
    """Send ``messages`` over ``concurrency`` connections; return the stats."""
    prebuilt = transactions(messages, shape)
    cpu0 = time.process_time()
    # The clock starts before the connections open, as the ceiling's does: batchrun's
    # duration includes opening its own.
    started = time.monotonic()
    streams = await asyncio.gather(
        *(asyncio.open_connection(host, port) for _ in range(concurrency))
    )
    claimed = errors = 0

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal claimed, errors
        await reply(reader, b"220")
        writer.write(b"EHLO localhost\r\n")
        await reply(reader, b"250")
        while claimed < messages:
            mail, rcpt, body = prebuilt[claimed % len(prebuilt)]
            claimed += 1
            # No drain(): each write waits for its reply, so the transport never holds
            # more than one message.
            try:
                writer.write(mail)
                await reply(reader, b"250")
                writer.write(rcpt)
                await reply(reader, b"25")  # 250 or 251
                writer.write(b"DATA\r\n")
                await reply(reader, b"354")
                writer.write(body)
                await reply(reader, b"250")
            except ReplyError:
                errors += 1
                writer.write(b"RSET\r\n")
                await reply(reader, b"250")

    await asyncio.gather(*(worker(r, w) for r, w in streams))
    elapsed = time.monotonic() - started
    cpu = time.process_time() - cpu0
    for _, writer in streams:
        writer.write(b"QUIT\r\n")
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in streams), return_exceptions=True)
    return {
        "messages": claimed - errors,
        "errors": errors,
        "duration_s": round(elapsed, 3),
        "per_s": round((claimed - errors) / elapsed, 1) if elapsed else None,
        "shape": shape,
        "message_bytes": round(sum(len(b) - 3 for _, _, b in prebuilt) / len(prebuilt)),
        "sending_cpu_s": round(cpu, 3),  # the process's CPU on the clock (not start-up)
        "cpu_s": round(time.process_time(), 3),
    }


def main() -> None:
    """Parse options, send, print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--shape", choices=("birthday", "greeting"), default="birthday")
    args = parser.parse_args()
    result = asyncio.run(run(args.host, args.port, args.messages, args.concurrency, args.shape))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The ceiling: a bare sender pushing messages to the SMTP sink, no database.

K persistent aiosmtplib connections (K = batchrun's concurrency), each sending pre-built
messages of the same shape and size as batchrun's birthday email, one after another.
Its messages/s is the most any sender in this language and event loop can get out of the
sink at the given latency. ``--shape greeting`` sends the user-defined job's plain text
message instead (``bench/greeting_job.py``, ~430 bytes, a ninth of the birthday's), to
show what message size alone costs. Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any, cast

import aiosmtplib

from batchrun.effects.sending import Sender
from batchrun.job import Context
from batchrun.jobs.birthday import Birthday, codes
from batchrun.mail.message import Message
from batchrun.mail.smtp_transaction import transaction
from batchrun.period import parse
from batchrun.pipeline.engine import StopToken
from batchrun.settings import Settings
from batchrun.templates import DEFAULTS, Templates, job_folder

SENDER = "birthday@localhost"


def sample_messages(count: int, shape: str = "birthday") -> list[tuple[str, bytes]]:
    """``count`` (recipient, raw bytes) pairs built by batchrun's own message code: the
    birthday job's template, rendered and encoded as a run would (``shape="greeting"``:
    the greeting job's subject and text, no template)."""
    return [(m.to_addr, m.to_bytes()) for m in sample_message_objects(count, shape)]


def sample_message_objects(count: int, shape: str = "birthday") -> list[Message]:
    """The ``Message`` objects of ``sample_messages``, not yet turned into bytes."""
    job = Birthday()
    sender = Sender(
        None,
        # The run's own settings: with bench/run.py's unsubscribe secret, the same
        # List-Unsubscribe fields and unsubscribe link as batchrun's messages.
        Settings.from_env().with_overrides(sender=SENDER),
        summary=None,
        lease=None,
        stop=StopToken(),
        limiter=None,
        templates=Templates([job_folder(job), DEFAULTS]),
    )
    ctx = Context(job, parse("month", "2025-06"), cast(Any, None), sender)
    out = []
    for i in range(count):
        if shape == "greeting":
            message = sender.message(
                ctx.entity(i + 1),
                to=f"user{i + 1}.123456@example.com",
                subject="Hello Grace",
                text="Hello Grace,\n\nthis is a short note for 2025-06.\n\nBest wishes\n",
                html=None,
                to_name="Grace Hopper",
                template=None,
                variables={},
            )
            out.append(message)
            continue
        code = codes.new_code()
        redeem = os.environ.get("BATCHRUN_REDEEM_URL")
        message = sender.message(
            ctx.entity(i + 1),
            to=f"user{i + 1}.123456@example.com",
            subject=None,
            text=None,
            html=None,
            to_name="Grace Hopper",
            template="birthday",
            variables={
                "first_name": "Grace",
                "last_name": "Hopper",
                "code": codes.display(code),
                "year": 2025,
                "redeem_url": redeem.replace("{code}", code) if redeem else None,
                "postal_address": os.environ.get("BATCHRUN_POSTAL_ADDRESS") or None,
            },
        )
        out.append(message)
    return out


async def run(
    host: str,
    port: int,
    messages: int,
    concurrency: int,
    shape: str = "birthday",
    *,
    lean: bool = False,
) -> dict[str, Any]:
    """Send ``messages`` over ``concurrency`` persistent connections; return the stats.

    ``lean``: each message goes with batchrun's own SMTP transaction (MAIL, RCPT, DATA
    without sendmail's re-parsing), as batchrun's SMTP mailer sends it."""
    prebuilt = sample_messages(min(messages, 256), shape)
    # The clock starts before the connections open: batchrun's duration includes opening
    # its own, so both pay the same set-up (200 greetings and EHLOs are ~0.1 s of CPU).
    started = time.monotonic()
    clients = [aiosmtplib.SMTP(hostname=host, port=port, timeout=30) for _ in range(concurrency)]
    await asyncio.gather(*(c.connect() for c in clients))
    if lean:
        await asyncio.gather(*(c.ehlo() for c in clients if c.is_ehlo_or_helo_needed))
    next_index = 0
    errors = 0

    async def worker(client: aiosmtplib.SMTP) -> None:
        nonlocal next_index, errors
        while next_index < messages:
            rcpt, raw = prebuilt[next_index % len(prebuilt)]
            next_index += 1
            try:
                # No deadline at all: the least work a sender can do per message
                # (batchrun sets one deadline per message, the ceiling none).
                if lean:
                    await transaction(client, SENDER, rcpt, raw)
                else:
                    await client.sendmail(SENDER, [rcpt], raw, timeout=None)
            except aiosmtplib.SMTPException:
                errors += 1

    await asyncio.gather(*(worker(c) for c in clients))
    elapsed = time.monotonic() - started
    await asyncio.gather(*(c.quit() for c in clients), return_exceptions=True)
    return {
        "messages": messages,
        "errors": errors,
        "duration_s": round(elapsed, 3),
        "per_s": round(messages / elapsed, 1) if elapsed else None,
        "shape": shape,
        "lean": lean,
        "message_bytes": len(prebuilt[0][1]) if prebuilt else 0,
        "cpu_s": round(time.process_time(), 3),
    }


def main() -> None:
    """Parse options, send, print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--shape", choices=("birthday", "greeting"), default="birthday")
    parser.add_argument(
        "--lean", action="store_true", help="send with batchrun's SMTP transaction, not sendmail"
    )
    args = parser.parse_args()
    result = asyncio.run(
        run(args.host, args.port, args.messages, args.concurrency, args.shape, lean=args.lean)
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

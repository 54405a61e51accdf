"""The reference: our port of the seed's naive Node.js algorithm (seeds/002_*.txt).

Faithful to the seed, flaws included:

- loop: run the "optimised" page query (the anti-join on ``gift_card`` with the
  ``scheduled_at`` year range, ``MONTH(u.date_of_birth) = ?``, ``LIMIT 100``, no ORDER BY,
  no cursor), so every page rescans from the start of the table;
- for each user of the page, under a concurrency limit of 20 (p-limit): one INSERT of a
  gift card with an 8-character ``Math.random()``-style code, then one email sent over a
  NEW SMTP connection (connect, EHLO, send, QUIT); errors are only logged;
- wait for the whole page (``Promise.all``) before querying the next one.

Where the seed leaves a choice open, the kindest reading is taken: a pool of 20 database
connections (one per concurrent task; the seed names a single ``dbConnection``), and a
safety stop if a page holds only users already tried (the seed would loop forever when
an INSERT fails, since the user stays eligible). Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import string
import time
from email.message import EmailMessage
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomysql
import aiosmtplib

log = logging.getLogger("bench.naive")

CONCURRENCY = 20
MESSAGE = "Happy birthday! from BURST"
SENDER = "birthday@localhost"

# The seed's "SQL 查询优化建议" variant, as written (user is not reserved in MariaDB).
PAGE_QUERY = """
SELECT u.id, u.first_name, u.last_name, u.email, u.date_of_birth
FROM user u
LEFT JOIN gift_card gc ON
    gc.scheduled_at >= CONCAT(%s,'-01-01') AND gc.scheduled_at < CONCAT(CAST(%s AS UNSIGNED)+1,'-01-01') AND
    gc.message = 'Happy birthday! from BURST' AND
    gc.status = 1 AND
    gc.recipient_email = u.email
WHERE
    MONTH(u.date_of_birth) = %s AND
    u.email IS NOT NULL AND u.status = 10 AND
    gc.recipient_email IS NULL
LIMIT 100
"""  # noqa: E501

INSERT_CARD = """
INSERT INTO gift_card (recipient_email, message, status, scheduled_at, gift_code)
VALUES (%s, 'Happy birthday! from BURST', 1, %s, %s)
"""

_BASE36 = string.digits + string.ascii_uppercase


def gift_code() -> str:
    """``Math.random().toString(36).substring(2, 10).toUpperCase()``: 8 insecure chars."""
    return "".join(random.choices(_BASE36, k=8))


def birthday_email(user: tuple[Any, ...], code: str) -> EmailMessage:
    """A birthday email about the size of batchrun's (text and HTML parts)."""
    _, first, last, email, _ = user
    msg = EmailMessage()
    msg["From"] = SENDER
    msg["To"] = email
    msg["Subject"] = "Happy birthday! A gift card for you"
    msg.set_content(f"Happy birthday, {first}!\n\nHere is a gift card for you: {code}\n")
    msg.add_alternative(
        f"<p>Happy birthday, {first} {last}!</p><p>Here is a gift card: <b>{code}</b></p>",
        subtype="html",
    )
    return msg


async def run(db_url: str, smtp_host: str, smtp_port: int, year: int, month: int) -> dict[str, Any]:
    """Run the seed's loop until the page query returns nothing; return the counts."""
    parts = urlsplit(db_url)
    pool = await aiomysql.create_pool(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        db=parts.path.lstrip("/"),
        autocommit=True,
        minsize=1,
        maxsize=CONCURRENCY,
    )
    limit = asyncio.Semaphore(CONCURRENCY)
    counts = {"pages": 0, "processed": 0, "cards": 0, "sent": 0, "failed": 0}
    page_times: list[float] = []
    tried: set[int] = set()
    scheduled = f"{year:04d}-{month:02d}-01"
    stuck = False

    async def fetch_page() -> list[tuple[Any, ...]]:
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute(PAGE_QUERY, (str(year), str(year), f"{month:02d}"))
            return list(await cur.fetchall())

    async def process(user: tuple[Any, ...]) -> None:
        async with limit:
            try:
                code = gift_code()
                async with pool.acquire() as conn, conn.cursor() as cur:
                    await cur.execute(INSERT_CARD, (user[3], scheduled, code))
                counts["cards"] += 1
                await aiosmtplib.send(
                    birthday_email(user, code),
                    sender=SENDER,
                    recipients=[user[3]],
                    hostname=smtp_host,
                    port=smtp_port,
                    timeout=30,
                )
                counts["sent"] += 1
            except Exception as exc:  # the seed only logs (console.error)
                counts["failed"] += 1
                log.debug("user %s failed: %s", user[0], exc)

    started = time.monotonic()
    try:
        while True:
            t0 = time.monotonic()
            users = await fetch_page()
            page_times.append(time.monotonic() - t0)
            if not users:
                break
            ids = {int(u[0]) for u in users}
            if ids <= tried:
                stuck = True  # the seed would spin here forever
                break
            tried |= ids
            counts["pages"] += 1
            counts["processed"] += len(users)
            await asyncio.gather(*(process(u) for u in users))
    finally:
        pool.close()
        await pool.wait_closed()
    elapsed = time.monotonic() - started
    return {
        **counts,
        "stuck": stuck,
        "duration_s": round(elapsed, 3),
        "per_s": round(counts["processed"] / elapsed, 1) if elapsed else None,
        "page_query_s": round(sum(page_times), 3),
        "first_page_query_ms": round(page_times[0] * 1000, 2) if page_times else None,
        "last_page_query_ms": round(page_times[-2] * 1000, 2) if len(page_times) > 1 else None,
        "cpu_s": round(time.process_time(), 3),
    }


def main() -> None:
    """Parse options, run, print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="mysql://user:pass@host:port/db")
    parser.add_argument("--smtp-host", default="127.0.0.1")
    parser.add_argument("--smtp-port", type=int, required=True)
    parser.add_argument("--month", default="2025-06", help="YYYY-MM")
    args = parser.parse_args()
    year, month = (int(p) for p in args.month.split("-"))
    result = asyncio.run(run(args.db, args.smtp_host, args.smtp_port, year, month))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

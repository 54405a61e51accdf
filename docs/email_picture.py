"""Render the default birthday email to docs/birthday-email.png (the README's picture).

Runs the birthday job the way ``make demo`` does (SQLite, seeded users, the file
outbox), with a brand (the ``--from`` name), a redeem URL, a postal address and one-click
unsubscribe set, takes the HTML part of one outbox file, and screenshots it with headless
Chromium (``apt-get install -y chromium``)::

    python docs/email_picture.py [--out docs/birthday-email.png] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import email
import email.policy
import os
import shutil
import subprocess
import sys
import tempfile
from email.message import EmailMessage
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    "BATCHRUN_FROM": "Acme Gifts <birthday@acme.example>",
    "BATCHRUN_REDEEM_URL": "https://acme.example/redeem?code={code}",
    "BATCHRUN_POSTAL_ADDRESS": "Acme Gifts Ltd\n1 Example Street, 10115 Berlin",
    "BATCHRUN_UNSUBSCRIBE_URL": "https://acme.example/unsubscribe",
    "BATCHRUN_UNSUBSCRIBE_SECRET": "demo-secret-for-the-picture-only",
}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def outbox_html(work: Path) -> str:
    """The HTML part of one birthday email a demo-style run writes to its outbox."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env |= ENV | {
        "PYTHONPATH": str(ROOT),
        "BATCHRUN_DB": f"sqlite:///{work / 'demo.db'}",
        "BATCHRUN_MAIL": f"file://{work / 'outbox'}",
    }
    for args in (
        ["db", "migrate"],
        ["db", "seed", "--users", "60", "--seed", "1"],
        ["birthday", "--month", "2025-06"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "batchrun", *args],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(f"batchrun {' '.join(args)} exited {done.returncode}: {done.stderr}")
    first = sorted((work / "outbox").glob("*.eml"))[0]
    parsed = email.message_from_bytes(first.read_bytes(), policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    part = parsed.get_body(("html",))
    assert part is not None, f"{first} has no HTML part"
    return str(part.get_content())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "birthday-email.png")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    # 580 pixels high: the whole email at 640 wide, without a band of empty background.
    parser.add_argument("--size", default="640,580", help="window WIDTH,HEIGHT in pixels")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        page = work / "birthday.html"
        page.write_text(outbox_html(work), encoding="utf-8")
        profile = work / "chromium-profile"
        subprocess.run(
            [
                args.chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--screenshot={args.out.resolve()}",
                f"--window-size={args.size}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()

"""Take docs/dashboard.png (the README's picture of `batchrun ui`) with the browser the
dashboard's tests use: Debian's chromium through its chromedriver (Selenium).

It makes a demo database the way ``make demo`` does (SQLite, seeded users), runs May in
full, starts June slowly (``--rate``) and captures the jobs page while June runs::

    python docs/dashboard_picture.py [--out docs/dashboard.png] [--size 1280,480]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.browser import start, wait_for  # noqa: E402  (tests/support/browser.py: the tests' browser)
from support.ui import serve  # noqa: E402


def batchrun(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "batchrun", *args], env=env, capture_output=True, text=True
    )
    if done.returncode not in (0, 3):
        sys.exit(f"batchrun {' '.join(args)} exited {done.returncode}: {done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    parser.add_argument("--size", default="1280,480", help="window WIDTH,HEIGHT in pixels")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        env |= {
            "PYTHONPATH": str(ROOT),
            "BATCHRUN_DB": f"sqlite:///{work / 'batchrun.db'}",
            "BATCHRUN_MAIL": "discard://",
            "BATCHRUN_FROM": "Acme Gifts <birthday@acme.example>",
        }
        batchrun(env, "db", "migrate")
        batchrun(env, "db", "seed", "--users", "6000", "--seed", "1")
        batchrun(env, "birthday", "--month", "2025-05")
        june = subprocess.Popen(
            [sys.executable, "-m", "batchrun", "birthday", "--month", "2025-06", "--rate", "40"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        driver = start(width, height)
        try:
            with serve(env) as base:
                driver.get(base + "/")
                sent = '[data-live="birthday.sent"]'

                def halfway() -> bool:
                    text = driver.find_element("css selector", sent).text
                    return text.isdigit() and int(text) >= 200

                wait_for(halfway, timeout=60, what="June under way")
                time.sleep(1.2)  # one more refresh of the live parts
                driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
            june.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                june.wait(timeout=20)
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()

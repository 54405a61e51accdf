"""Run batchrun or the ceiling on another event loop, for ``bench.run --loop uvloop``.

``python -m bench.loop uvloop batchrun ARGS...`` or ``python -m bench.loop uvloop
bench.ceiling ARGS...``: installs uvloop's loop policy, then runs the target as if it had
been started directly, so both contenders of a run use the same loop. batchrun chooses
its own loop (``BATCHRUN_EVENT_LOOP``, default uvloop when installed): it is set to the
loop named here, so ``asyncio`` measures batchrun on asyncio's loop even where uvloop is
installed (bench/README.md, "Event loop", has the measurements).
"""

from __future__ import annotations

import asyncio
import os
import runpy
import sys


def main() -> None:
    """Parse ``LOOP TARGET ARGS...``, install the loop policy, run the target."""
    if len(sys.argv) < 3 or sys.argv[1] not in ("asyncio", "uvloop"):
        sys.exit("usage: python -m bench.loop asyncio|uvloop batchrun|MODULE [ARGS...]")
    loop, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.environ["BATCHRUN_EVENT_LOOP"] = loop
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            sys.exit("bench --loop uvloop needs uvloop: pip install uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    sys.argv = [target, *args]
    if target == "batchrun":
        from batchrun.cli import main as batchrun_main

        batchrun_main()
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

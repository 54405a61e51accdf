"""The event loop a command runs on: uvloop when it is installed, else asyncio's own.

uvloop (``pip install 'batchrun[uvloop]'``) does the loop's own work (sockets, timers,
callbacks) in C: the birthday run spends 3-11% less CPU per entity on it, measured
against Postfix's smtp-sink (bench/README.md, "Event loop"). ``BATCHRUN_EVENT_LOOP``
chooses: ``auto`` (the default: uvloop if it can be imported), ``asyncio``, ``uvloop``
(an error when it is not installed). Every command and the Lambda handler run their
coroutine through ``run`` (``batchrun ui`` hands the choice to uvicorn); a job author's
tests (``batchrun.testing``) stay on asyncio's loop. The Lambda zip that
``deploy/build_lambda.py`` builds does not carry uvloop: the handler runs on asyncio's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from batchrun.errors import ConfigError
from batchrun.settings import event_loop_choice

T = TypeVar("T")

log = logging.getLogger(__name__)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop ``choice`` names; None for asyncio's own.

    Raises:
        ConfigError: ``uvloop`` chosen but not installed, or no choice at all.
    """
    choice = event_loop_choice(choice)
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "BATCHRUN_EVENT_LOOP=uvloop, but uvloop is not installed: "
                "pip install 'batchrun[uvloop]'"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names."""
    factory = loop_factory(choice)
    log.debug("event loop: %s", "asyncio" if factory is None else "uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

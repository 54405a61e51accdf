"""An effect a job's code must await, which knows whether it was.

``ctx.send_email(...)`` without ``await`` makes a coroutine that never runs: Python warns
when it is dropped, and ``process`` returns as if the email went out, so the ledger would
record a success that sent nothing. ``Context`` hands out ``Awaited`` instead and, once
``process`` returns, ``Awaited.forgotten`` tells the worker of any that never ran.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from types import TracebackType
from typing import Any


class NotAwaitedError(RuntimeError):
    """``process`` started an effect and returned without awaiting it: a bug in the job
    (the same for every entity, so the bug threshold stops the run)."""


class Awaited(Coroutine[Any, Any, None]):
    """``coroutine`` itself to whoever runs it (``await``, ``asyncio.create_task``,
    ``TaskGroup``, ``gather``: a ``Coroutine``); remembers that it was run."""

    __slots__ = ("_coroutine", "awaited", "what")

    def __init__(self, coroutine: Coroutine[Any, Any, None], what: str) -> None:
        self._coroutine = coroutine
        self.what = what  # the call, for the error: "ctx.send_email(...)"
        self.awaited = False

    def __await__(self) -> Generator[Any, None, None]:
        self.awaited = True
        return self._coroutine.__await__()

    def send(self, value: Any) -> Any:
        self.awaited = True
        return self._coroutine.send(value)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: BaseException | object = None,
        tb: TracebackType | None = None,
    ) -> Any:
        self.awaited = True
        if val is None and tb is None:
            return self._coroutine.throw(typ)
        return self._coroutine.throw(typ, val, tb)  # type: ignore[arg-type]

    def close(self) -> None:
        self._coroutine.close()

    @staticmethod
    def forgotten(started: list[Awaited] | None) -> None:
        """Raise ``NotAwaitedError`` if one of ``started`` was never awaited (closed now,
        so Python does not warn a second time)."""
        missed = [a for a in started or () if not a.awaited]
        for one in missed:
            one._coroutine.close()
        if missed:
            raise NotAwaitedError(
                f"process() called {missed[0].what} without await: it never ran"
                + (f" ({len(missed)} calls)" if len(missed) > 1 else "")
            )

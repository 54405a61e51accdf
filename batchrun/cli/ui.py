"""``batchrun ui``: the dashboard (the extra ``batchrun[ui]``: Starlette and uvicorn)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Annotated

import typer

from batchrun.cli.app import Invocation, app
from batchrun.cli.conventions import examples, stderr
from batchrun.errors import BatchrunError
from batchrun.runtime import event_loop
from batchrun.runtime.resources import open_backends
from batchrun.runtime.runtime import Runtime
from batchrun.urls import mask_text


@app.command(
    "ui",
    epilog=examples(
        "batchrun ui                               # http://127.0.0.1:8765/",
        "BATCHRUN_UI_TOKEN=… batchrun ui --host 0.0.0.0 --read-only",
    ),
)
def ui(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Address to listen on; other than loopback needs BATCHRUN_UI_TOKEN."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8765,
    read_only: Annotated[
        bool,
        typer.Option("--read-only", metavar="", help="Show no pause, resume, cancel or redrive."),
    ] = False,
) -> None:
    """Serve the dashboard: jobs and their runs, live progress, an entity's story, the
    retry and dead-letter queues, /metrics; pause, resume, cancel and redrive.

    It listens on 127.0.0.1 by default. Any other address needs BATCHRUN_UI_TOKEN (sent as
    Authorization: Bearer, or through the login form), or it refuses to start. Needs
    `pip install 'batchrun\\[ui]'`.
    """
    context: Invocation = ctx.obj
    settings = context.settings
    token = settings.environ.get("BATCHRUN_UI_TOKEN") or None
    try:
        import uvicorn

        from batchrun.ui.app import create_app
        from batchrun.ui.security import bind_error, token_warning
    except ImportError as exc:
        stderr.print(
            f"[red]error:[/] the dashboard needs {exc.name}: pip install 'batchrun\\[ui]'",
            highlight=False,
        )
        raise typer.Exit(1) from None
    refused = bind_error(host, token)
    if refused is not None:
        stderr.print(f"[red]error:[/] {refused}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    weak = token_warning(token)
    if weak is not None:  # still served: a setup with a short token keeps working
        stderr.print(f"[yellow]warning:[/] {weak}", highlight=False, soft_wrap=True)
    try:
        registry = context.registry
    except BatchrunError as exc:
        stderr.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(exc.exit_code) from None

    @contextlib.asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        jobs = [e.job for e in registry.values()]
        async with open_backends(settings, queue=True, jobs=jobs) as backends:
            yield context.runtime(backends)

    async def check() -> None:
        async with open_runtime():
            pass

    try:  # a database that cannot be used is one line, before the server starts
        event_loop.run(check(), settings.event_loop)
    except BatchrunError as exc:
        text = mask_text(str(exc), settings.db_url, settings.mail_url, settings.retry_queue_url)
        stderr.print(f"[red]error:[/] {text}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    web = create_app(open_runtime, token=token, read_only=read_only)
    # BATCHRUN_EVENT_LOOP: uvicorn's own names for the same three choices.
    config = uvicorn.Config(
        web, host=host, port=port, log_level="warning", lifespan="on", loop=settings.event_loop
    )
    server = uvicorn.Server(config)
    refused = _cannot_listen(host, port)
    if refused is not None:
        stderr.print(f"[red]error:[/] cannot listen on {host}:{port}: {refused}", highlight=False)
        raise typer.Exit(1)
    stderr.print(f"batchrun ui on http://{host}:{port}/", highlight=False)
    try:
        server.run()
    except SystemExit:  # uvicorn's own exit (it logged why): a fatal error here
        raise typer.Exit(1) from None
    if not server.started:
        raise typer.Exit(1)


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (in use, no such address), or None."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc.strerror or exc)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return str(exc.strerror or exc).lower()
    return None

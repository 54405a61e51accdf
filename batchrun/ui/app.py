"""The dashboard's Starlette app: server-rendered pages, POST actions, ``/metrics``.

``create_app`` takes a factory that opens the runtime for the app's life (the CLI's
backends), so tests and ``batchrun ui`` build it the same way.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from batchrun.control import metrics, story
from batchrun.db.store import MAX_ID
from batchrun.errors import BatchrunError
from batchrun.job import Job
from batchrun.period import parse as parse_period
from batchrun.runtime.runtime import Runtime
from batchrun.task import is_task
from batchrun.ui import control, data, notices
from batchrun.ui.gate import Gate, read_form
from batchrun.ui.security import COOKIE, Guard, SecureHeaders, client_address, too_many
from batchrun.urls import mask_url

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
STATES = ("pending", "sent", "skipped", "retrying", "failed")

log = logging.getLogger(__name__)

RuntimeFactory = Callable[[], contextlib.AbstractAsyncContextManager[Runtime]]


class Dashboard:
    """The pages and actions over one runtime."""

    def __init__(self, guard: Guard, *, read_only: bool) -> None:
        self.guard = guard
        self.read_only = read_only
        self.rt: Runtime | None = None

    @property
    def runtime(self) -> Runtime:
        assert self.rt is not None, "the dashboard's runtime is opened by its lifespan"
        return self.rt

    def job(self, name: str) -> Job:
        found = self.runtime.jobs.get(name)
        if found is None:
            raise _NotFound(f"no job {name!r}")
        return found

    def page(self, request: Request, name: str, live: str = "", **values: Any) -> Response:
        context = {
            "db_url": mask_url(self.runtime.settings.db_url),
            "read_only": self.read_only,
            "csrf": self.guard.csrf,
            "notice": notices.text(request.query_params, self.runtime.jobs),
            "live_url": live,
            **values,
        }
        return TEMPLATES.TemplateResponse(request, name, context)

    # -- pages ----------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        rt = self.runtime
        jobs = [await self._job_row(job) for job in rt.jobs.values()]
        return self.page(request, "index.html", "/api/live", jobs=jobs, depths=await _depths(rt))

    async def _job_row(self, job: Job) -> dict[str, Any]:
        last, running = await control.runs_now(self.runtime, job)
        progress = await data.progress(self.runtime, job, _period_running(running))
        paused = await control.paused(self.runtime, job, progress.period)
        return {
            "name": job.name,
            "description": job.description,
            "progress": progress,
            "paused": paused,
            "last_run": last,
            "now": _now_text(running, paused),
        }

    async def live(self, request: Request) -> Response:
        """The numbers the pages' script refreshes, by the keys their elements name."""
        rt = self.runtime
        out: dict[str, Any] = {}
        depths = await _depths(rt)
        out["queue.retry"], out["queue.dead"] = depths["retry"], depths["dead"]
        wanted = request.query_params.get("job")
        for job in rt.jobs.values():
            if wanted and job.name != wanted:
                continue
            _, running = await control.runs_now(rt, job)
            period = request.query_params.get("period") if wanted else _period_running(running)
            try:
                p = await data.progress(rt, job, period)
            except ValueError as exc:
                return PlainTextResponse(str(exc), status_code=400)
            paused = await control.paused(rt, job, p.period)
            key = f"{job.name}/{p.period}" if wanted else job.name
            out[f"{key}.bar"] = {**p.to_json(), "paused": paused}
            out[f"{key}.sent"] = p.counts.get("sent", 0)
            out[f"{key}.done"] = f"{p.done} / {p.total}"
            out[f"{key}.now"] = _now_text(running, paused)
            for state in STATES:
                out[f"{key}.{state}"] = p.counts.get(state, 0)
        return JSONResponse(out)

    async def job_page(self, request: Request) -> Response:
        job = self.job(request.path_params["job"])
        periods = await data.periods(self.runtime, job)
        asked = request.query_params.get("period")
        try:
            selected = str(data.period_of(job, asked)) if asked else None
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        if selected is None or is_task(job):  # the newest with ledger rows, else the current
            selected = periods[0].period if periods else str(data.period_of(job, None))
        runs = await control.runs_of(self.runtime, job)
        live = "/api/live?" + urlencode({"job": job.name, "period": selected})
        return self.page(
            request,
            "job.html",
            live,
            job=job,
            periods=periods,
            selected=selected,
            states=STATES,
            runs=runs,
            is_task=is_task(job),
        )

    async def lookup(self, request: Request) -> Response:
        """The entity form's GET: on to the entity's page."""
        job = self.job(request.path_params["job"])
        entity = request.query_params.get("id", "")
        if not _an_id(entity):
            return PlainTextResponse("id must be a positive integer", status_code=400)
        query = urlencode({"period": request.query_params.get("period", "")})
        return RedirectResponse(f"/jobs/{job.name}/entities/{int(entity)}?{query}", 303)

    async def entity(self, request: Request) -> Response:
        job = self.job(request.path_params["job"])
        try:
            period = data.period_of(job, request.query_params.get("period"))
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        entity_id = int(request.path_params["entity"])
        if not 0 < entity_id <= MAX_ID:
            raise _NotFound("no such entity")
        told = await story.tell(self.runtime.wiring, job, period, entity_id)
        return self.page(request, "entity.html", story=told.to_json(), of_tasks=told.of_tasks)

    async def run_page(self, request: Request) -> Response:
        run_id = int(request.path_params["run"])
        if not 0 < run_id <= MAX_ID:
            raise _NotFound("no such run")
        found = await control.run(self.runtime, run_id)
        if found is None:
            raise _NotFound("no such run")
        run, problems = found
        return self.page(request, "run.html", run=run, problems=problems)

    async def dead(self, request: Request) -> Response:
        rt = self.runtime
        letters, why_not = await data.dead_letters(rt)
        return self.page(
            request,
            "dead.html",
            dead=letters,
            dead_why_not=why_not,
            waiting=await data.waiting(rt),
            queue_url=rt.queue.url if rt.queue is not None else "",
        )

    async def metrics_page(self, request: Request) -> Response:
        rt = self.runtime
        snapshot = await metrics.collect(
            rt.store, rt.queue, last_runs=await metrics.last_runs(rt.store)
        )
        return Response(metrics.render(snapshot), media_type=metrics.CONTENT_TYPE)

    # -- actions --------------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        form = await read_form(request)
        job = self.job(request.path_params["job"])
        action = request.path_params["action"]
        period = form.get("period") or None  # none: every period of the job
        if action not in control.ACTIONS:
            return _back(request, "unknown-action")
        if period and is_task(job) and action != "resume":  # resume clears an old row
            return _back(request, "task-period", action=action, job=job.name)
        try:
            which = parse_period(job.period, period) if period else None
        except ValueError:
            return _back(request, "bad-period", action=action, job=job.name)
        try:
            done = await control.steer(self.runtime, job, which, action, form.get("reason"))
        except BatchrunError as exc:
            log.warning("%s of %s failed: %s", action, job.name, self._masked(exc))
            return _back(request, "action-failed", action=action)
        return _back(request, done, job=job.name, period=None if which is None else str(which))

    async def redrive(self, request: Request) -> Response:
        form = await read_form(request)
        ids = [v for v in form.getlist("id") if v]
        try:
            moved = await data.redrive(self.runtime, ids)
        except BatchrunError as exc:  # the queue keeps no dead letters, or cannot be reached
            log.warning("redrive failed: %s", self._masked(exc))
            return _back(request, "redrive-failed", "/dead")
        return _back(request, "redriven", "/dead", count=moved)

    def _masked(self, exc: Exception) -> str:
        return control.masked(self.runtime, str(exc))

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            # Nothing of the database before login, nor which jobs it serves.
            notice = notices.text(request.query_params, jobs={})
            return self.page(request, "login.html", db_url="", notice=notice)
        address = client_address(request)
        wait_s = self.guard.logins.wait_s(address)
        if wait_s:  # the token is not even looked at
            return too_many(wait_s)
        form = await read_form(request)
        if not self.guard.token_matches(form.get("token", "")):
            self.guard.logins.failed(address)
            return PlainTextResponse("wrong token", status_code=403)
        response = RedirectResponse("/", 303)
        response.set_cookie(
            COOKIE,
            self.guard.session_value(),
            httponly=True,
            samesite="strict",
            path="/",
            secure=request.url.scheme == "https",  # behind a TLS proxy too (proxy headers)
        )
        return response


class _NotFound(Exception):
    pass


def _an_id(text: str) -> bool:
    """Whether ``text`` is an id a table can hold: ASCII digits, 1 to ``MAX_ID``."""
    return text.isascii() and text.isdecimal() and len(text) <= 19 and 0 < int(text) <= MAX_ID


def _back(
    request: Request, notice: str, to: str | None = None, **values: str | int | None
) -> Response:
    """Back to the page the form was on (the Referer's path on this dashboard), with the
    notice ``notice`` (a key of ``notices.NOTICES``) and its values; never to another
    site."""
    path = to or urlsplit(request.headers.get("referer", "")).path
    if not path.startswith("/") or path.startswith(("//", "/\\")):
        path = "/"
    return RedirectResponse(f"{path}?{notices.query(notice, **values)}", 303)


def _period_running(running: list[dict[str, Any]]) -> str | None:
    """The period the newest running run works on (None: none runs, or a worker's)."""
    return next((str(r["period"]) for r in running if r["period"]), None)


def _now_text(running: list[dict[str, Any]], paused: bool) -> str:
    if paused:
        return "paused"
    if not running:
        return "idle"
    return ", ".join(f"run #{r['id']} · {r['host']} pid {r['pid']}" for r in running)


async def _depths(rt: Runtime) -> dict[str, int | None]:
    if rt.queue is None:
        return {"retry": 0, "dead": None}
    waiting, dead = await rt.queue.depths()
    return {"retry": waiting, "dead": dead}


STATIC = Path(__file__).parent / "static"
_STATIC_TYPES = {"board.css": "text/css", "live.js": "text/javascript"}


async def _static(request: Request) -> Response:
    """The style sheet and the script (no inline ones: the CSP allows none); read once."""
    name = request.path_params["name"]
    if name not in _STATIC_TYPES:
        raise _NotFound(f"no file {name!r}")
    return Response(
        _static_bytes(name),
        media_type=_STATIC_TYPES[name],
        headers={"Cache-Control": "public, max-age=300"},
    )


@functools.cache
def _static_bytes(name: str) -> bytes:
    return (STATIC / name).read_bytes()


class _App(Starlette):
    """Starlette with ``SecureHeaders`` around its whole stack: the error middleware
    Starlette puts outermost answers too."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecureHeaders(super().build_middleware_stack())


def create_app(open_runtime: RuntimeFactory, *, token: str | None, read_only: bool) -> Starlette:
    """The dashboard over the runtime ``open_runtime`` opens for the app's life."""
    board = Dashboard(Guard(token), read_only=read_only)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_runtime() as rt:
            board.rt = rt
            yield
            board.rt = None

    routes = [
        Route("/", board.index),
        Route("/api/live", board.live),
        Route("/jobs/{job}", board.job_page),
        Route("/jobs/{job}/entity", board.lookup),
        Route("/jobs/{job}/entities/{entity:int}", board.entity),
        Route("/jobs/{job}/{action:str}", board.act, methods=["POST"]),
        Route("/runs/{run:int}", board.run_page),
        Route("/dead", board.dead),
        Route("/dead/redrive", board.redrive, methods=["POST"]),
        Route("/metrics", board.metrics_page),
        Route("/login", board.login, methods=["GET", "POST"]),
        Route("/static/{name:str}", _static),
    ]
    return _App(
        routes=routes,
        middleware=[Middleware(Gate, guard=board.guard, read_only=read_only)],
        exception_handlers={_NotFound: _not_found},
        lifespan=lifespan,
    )


async def _not_found(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=404)

"""What every request passes before the dashboard's pages: the Host, the token (when set)
and its limit of wrong ones, the CSRF token of every POST, read-only; and the bounded
read of a posted form."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from batchrun.ui.security import Guard, client_address, too_many

MAX_FORM = 16 * 1024


class Form(dict[str, str]):
    """A parsed form: the first value of each field, every value through ``getlist``."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__({k: v[0] for k, v in fields.items() if v})
        self._all = fields

    def getlist(self, name: str) -> list[str]:
        return self._all.get(name, [])


async def read_form(request: Request) -> Form:
    """The posted form; an empty one when its declared length is missing or over
    ``MAX_FORM``: such a body is never read (``/login`` takes it from anyone, and the
    server holds a body to its declared length). Read with ``body()``, which the gate's
    read keeps for the endpoint's."""
    declared = request.headers.get("content-length", "")
    if not declared.isdecimal() or int(declared[:12]) > MAX_FORM:
        return Form({})
    body = await request.body()
    if len(body) > MAX_FORM:
        return Form({})
    return Form(parse_qs(body.decode("utf-8", "replace")))


PUBLIC = frozenset({"/static/board.css", "/static/live.js"})


class Gate(BaseHTTPMiddleware):
    """The token (when set) and its limit of wrong ones, the CSRF token of every POST,
    and read-only."""

    def __init__(self, app: ASGIApp, guard: Guard, *, read_only: bool) -> None:
        super().__init__(app)
        self.guard, self.read_only = guard, read_only

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        guard = self.guard
        if not guard.host_ok(request.headers.get("host", "")):
            return PlainTextResponse("unexpected Host header", status_code=403)
        if request.method == "GET" and request.url.path in PUBLIC:
            return await call_next(request)  # the login page's style sheet: no data
        if request.url.path != "/login" and guard.token and guard.bearer(request) is not None:
            wait_s = guard.logins.wait_s(client_address(request))
            if wait_s:  # the token is not even looked at
                return too_many(wait_s)
        if request.url.path != "/login" and not guard.allowed(request):
            if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                return RedirectResponse("/login", 303)
            return PlainTextResponse("unauthorized: BATCHRUN_UI_TOKEN", status_code=401)
        if request.method == "POST" and request.url.path != "/login":
            if self.read_only:
                return PlainTextResponse("the dashboard is read-only", status_code=403)
            form = await read_form(request)
            if not guard.csrf_ok(form.get("csrf")):
                return PlainTextResponse("missing or wrong CSRF token", status_code=403)
        return await call_next(request)

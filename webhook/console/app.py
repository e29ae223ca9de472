"""The console's Starlette app: server-rendered pages, JSON under ``/api/``, live events.

Contract (the routes are documented in docs/console.md):
- Pages ``/tenants``, ``/queue``, ``/fairness``, ``/audit``, ``/cost`` (``/`` redirects
  to ``/tenants``) render the :class:`~webhook.console.data.ConsoleData` answer of the
  same name with Jinja2 templates shipped in the package; ``?partial=1`` renders only the
  page's content (what the page's script swaps in on a live update).
- ``/api/tenants``, ``/api/queue``, ``/api/fairness``, ``/api/audit``, ``/api/cost``
  answer that data as JSON; ``/api/events`` is the Server-Sent-Events stream of
  :class:`~webhook.console.events.Broadcaster`.
- Every route but ``/healthz`` asks :class:`~webhook.console.access.Access` who the
  request is, and shows only what that viewer sees. A token given as ``?token=`` is
  kept in an HttpOnly, SameSite=Strict cookie, Secure unless ``secure_cookie`` is off
  (the operator says browsers reach the console over plain http: browsers keep and
  return a Secure cookie over https and to http://localhost or 127.0.0.1 only); a page
  opened with it redirects to the same URL without it (the token leaves the address bar
  and history).
- Errors: 401/403 with how to get in; 400 naming the bad parameter and what it accepts;
  503 naming the Redis that failed. Never a traceback.
- ``/static/<file>`` serves the CSS and JavaScript from the package; nothing is loaded
  from anywhere else (``Content-Security-Policy: default-src 'self'``).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import redis
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from webhook.console.access import COOKIE, Access, Denied, Viewer, token_of
from webhook.console.charts import line_chart, shared_top, split_series
from webhook.console.data import ConsoleData
from webhook.console.events import Broadcaster

PAGES = ("tenants", "queue", "fairness", "audit", "cost")
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class BadParameter(ValueError):
    """A query parameter the console cannot use; the message says what it accepts."""


def _int(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParameter(f"{name}={raw!r} is not a whole number: use {low} to {high}") from None
    if not low <= value <= high:
        raise BadParameter(f"{name}={value} is out of range: use {low} to {high}")
    return value


def _hours(query: Mapping[str, str]) -> float:
    raw = query.get("hours") or "6"
    try:
        value = float(raw)
    except ValueError:
        raise BadParameter(f"hours={raw!r} is not a number: use 0.1 to 168") from None
    if not 0.1 <= value <= 168:
        raise BadParameter(f"hours={value:g} is out of range: use 0.1 to 168")
    return value


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _pct(part: float | None, whole: float) -> float:
    if not part or whole <= 0:
        return 0.0
    return round(min(100.0, part / whole * 100), 1)


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("webhook.console", "templates"),
                      autoescape=select_autoescape(default=True), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters["when"] = _when
    env.filters["duration"] = _duration
    env.globals["pct"] = _pct
    env.globals["line_chart"] = line_chart
    env.globals["split_series"] = split_series
    env.globals["shared_top"] = shared_top
    env.globals["urlencode"] = urlencode
    return env


def create_app(data: ConsoleData, access: Access, events: Broadcaster,
               redis_name: str = "Redis", auth_mode: str = "token",
               secure_cookie: bool = True) -> Starlette:
    """The console app over ``data``, guarded by ``access``, live through ``events``;
    the token cookie is Secure unless ``secure_cookie`` is off."""
    env = _environment()
    static = resources.files("webhook.console") / "static"

    async def viewer_of(request: Request) -> Viewer:
        token = token_of(request.query_params, request.cookies, request.headers)
        return await run_in_threadpool(access.authenticate, token)

    def problem(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status_code=status,
                                headers=_SECURITY_HEADERS)
        page = env.get_template("error.html").render(status=status, message=message,
                                                     pages=PAGES, current=None)
        return HTMLResponse(page, status_code=status, headers=_SECURITY_HEADERS)

    def guarded(handler: Callable[[Request, Viewer], Awaitable[Response]]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                viewer = await viewer_of(request)
                response = await handler(request, viewer)
            except Denied as denied:
                response = problem(request, denied.status, denied.message)
                response.delete_cookie(COOKIE)
                return response
            except BadParameter as bad:
                return problem(request, 400, str(bad))
            except (redis.RedisError, OSError) as exc:
                return problem(request, 503, f"cannot read {redis_name} ({type(exc).__name__}"
                               "): check that Redis is up and --redis-url points at it")
            token = request.query_params.get("token")
            if token:
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                                    secure=secure_cookie)
            return response
        return endpoint

    async def gather(page: str, request: Request, viewer: Viewer) -> dict[str, Any]:
        q = request.query_params
        if page == "tenants":
            return await run_in_threadpool(data.tenants, viewer, q.get("q", ""),
                                           _int(q, "page", 1, 1, 100_000))
        if page == "queue":
            return await run_in_threadpool(data.queue_page, viewer, q.get("tenant") or None,
                                           q.get("namespace") or None,
                                           _int(q, "page", 1, 1, 1_000_000))
        if page == "fairness":
            return await run_in_threadpool(data.fairness, viewer, _hours(q),
                                           q.get("tenant") or None,
                                           _int(q, "page", 1, 1, 100_000))
        if page == "audit":
            return await run_in_threadpool(data.audit, viewer, q.get("q", ""),
                                           q.get("decision") or None,
                                           _int(q, "limit", 100, 1, 1000))
        return data.cost(viewer)

    def html_page(page: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request, viewer: Viewer) -> Response:
            if request.query_params.get("token"):
                rest = {k: v for k, v in request.query_params.items() if k != "token"}
                url = request.url.path + ("?" + urlencode(rest) if rest else "")
                return RedirectResponse(url, status_code=303, headers=_SECURITY_HEADERS)
            answer = await gather(page, request, viewer)
            template = env.get_template(f"{page}.html")
            query = dict(request.query_params)
            body = template.render(d=answer, viewer=viewer, pages=PAGES, current=page,
                                   query=query, partial=bool(query.get("partial")),
                                   auth_mode=auth_mode)
            return HTMLResponse(body, headers=_SECURITY_HEADERS)
        return guarded(handler)

    def api_page(page: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request, viewer: Viewer) -> Response:
            return JSONResponse(await gather(page, request, viewer), headers=_SECURITY_HEADERS)
        return guarded(handler)

    async def index(request: Request, viewer: Viewer) -> Response:
        return RedirectResponse("/tenants", status_code=303, headers=_SECURITY_HEADERS)

    async def stream(request: Request, viewer: Viewer) -> Response:
        refused = events.refusal(viewer)
        if refused is not None:
            return problem(request, 429, refused)
        return StreamingResponse(events.subscribe(viewer), media_type="text/event-stream",
                                 headers={**_SECURITY_HEADERS, "X-Accel-Buffering": "no"})

    async def static_file(request: Request, viewer: Viewer) -> Response:
        name = request.path_params["name"]
        suffix = name[name.rfind("."):] if "." in name else ""
        item = static / name
        if "/" in name or suffix not in _STATIC_TYPES or not item.is_file():
            return problem(request, 404, f"no static file {name!r}")
        return Response(item.read_bytes(), media_type=_STATIC_TYPES[suffix],
                        headers=_SECURITY_HEADERS)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [Route("/healthz", healthz), Route("/", guarded(index)),
              Route("/api/events", guarded(stream)),
              Route("/static/{name}", guarded(static_file))]
    for page in PAGES:
        routes.append(Route(f"/{page}", html_page(page)))
        routes.append(Route(f"/api/{page}", api_page(page)))

    async def not_found(request: Request, exc: Exception) -> Response:
        return problem(request, 404, f"no page {request.url.path}: try /tenants, /queue, "
                       "/fairness, /audit, /cost or /api/<page>")

    return Starlette(routes=routes, exception_handlers={404: not_found})

"""The dashboard's Starlette application: pages, the two actions and their guards."""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ...core.errors import ConfigurationError
from ...operations import Backlog
from ..display import duration_text, history, record_fields, status_name
from .schedules import schedule_rows

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

    from ...coordinator import Coordinator
    from ...worker import Worker

#: Host names that reach only this machine.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: The cookie that carries the access token after the first visit with ``?token=``.
TOKEN_COOKIE = "dbworker_dashboard"
#: Failed items listed on a worker's page.
FAILED_LIMIT = 100
TEMPLATES = Path(__file__).with_name("templates")
#: Line colours of the throughput chart, one per worker in turn.
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def _imports() -> Any:
    try:
        import jinja2
        import starlette
    except ImportError:
        raise ConfigurationError(
            "the dashboard needs Starlette, Jinja2 and uvicorn: pip install 'dbworker[dashboard]'"
        ) from None
    return starlette, jinja2


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Anything but this machine's loopback needs an access token."""
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"the dashboard serves {host} only with an access token (--token or "
            "$DBWORKER_DASHBOARD_TOKEN): it shows your data and can reset failed items"
        )


def throughput_svg(histories: dict[str, list[int]], width: int = 640, height: int = 180) -> str:
    """A line per worker of items finished per minute over the last hour, as SVG."""
    from markupsafe import Markup, escape

    left, bottom, top, right = 40, 22, 10, 10
    minutes = max((len(h) for h in histories.values()), default=60)
    peak = max((max(h, default=0) for h in histories.values()), default=0) or 1
    inner_w, inner_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + inner_w * i / max(1, minutes - 1)

    def y(v: int) -> float:
        return top + inner_h * (1 - v / peak)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="items finished per minute, last hour" class="chart">',
        f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" font-size="10">{peak}</text>',
        f'<text x="{left - 4}" y="{y(0)}" text-anchor="end" font-size="10">0</text>',
        f'<text x="{left}" y="{height - 6}" font-size="10">-60 min</text>',
        f'<text x="{width - right}" y="{height - 6}" text-anchor="end" font-size="10">now</text>',
    ]
    for n, (name, counts) in enumerate(sorted(histories.items())):
        colour = COLOURS[n % len(COLOURS)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(counts))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}">'
            f"<title>{escape(name)}: {sum(counts)} in the hour</title></polyline>"
        )
        parts.append(
            f'<text x="{left + 8 + 110 * n}" y="{top + 10}" fill="{colour}" font-size="11">'
            f"{escape(name)}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def create_app(
    coordinator: Coordinator, *, token: str | None = None, read_only: bool = False
) -> ASGIApp:
    """The dashboard of ``coordinator``'s workers (it need not be started)."""
    _imports()
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse
    from starlette.routing import Route

    environment = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"])
    )
    environment.filters["duration"] = duration_text
    # One CSRF token per process: forms carry it, and a page of another site cannot
    # read it (the same-origin policy), so it cannot forge a POST that carries it.
    csrf = secrets.token_urlsafe(32)

    def render(request: Request, template: str, status_code: int = 200, **values: Any) -> Response:
        page = environment.get_template(template).render(
            csrf=csrf, read_only=read_only, request=request, **values
        )
        return HTMLResponse(page, status_code=status_code)

    operations = coordinator.operations

    def registered(name: str) -> Worker:
        if name not in coordinator.workers:
            raise HTTPException(404, f"no worker named {name!r}")
        return coordinator.workers[name]

    def source_id(worker: Worker, text: str) -> Any:
        try:
            return operations.source_id(worker.name, text)
        except ConfigurationError as exc:
            raise HTTPException(404, str(exc)) from None

    def index(request: Request) -> Response:
        figures = operations.backlog()
        try:
            coordinators = operations.coordinators()
        except ConfigurationError:  # no registry table: the page says how to create it
            coordinators = None
        chart = throughput_svg({name: list(item.history) for name, item in figures.items()})
        return render(
            request,
            "index.html",
            figures={name: _shown(item) for name, item in figures.items()},
            coordinators=coordinators,
            chart=chart,
            schedules=schedule_rows(operations),
            limits=operations.limits(),
        )

    def worker_page(request: Request) -> Response:
        worker = registered(request.path_params["worker"])
        failed = operations.failed_items(worker.name, FAILED_LIMIT + 1, tracebacks=True)
        figures = operations.backlog(worker.name)[worker.name]
        return render(
            request,
            "worker.html",
            worker=worker,
            failed=failed[:FAILED_LIMIT],
            more=len(failed) > FAILED_LIMIT,
            figures=_shown(figures),
            limits=operations.limits(worker.name).get(worker.name),
            message=request.query_params.get("message"),
        )

    def item_page(request: Request) -> Response:
        worker = registered(request.path_params["worker"])
        key = source_id(worker, request.path_params["id"])
        found = operations.record(worker.name, key)
        if found is None:
            raise HTTPException(404, f"worker {worker.name} has no record of {key!r}")
        record = record_fields(found)
        return render(
            request,
            "item.html",
            worker=worker,
            record=record,
            history=history(record),
            message=request.query_params.get("message"),
        )

    async def check_post(request: Request) -> None:
        if read_only:
            raise HTTPException(403, "the dashboard is read-only")
        # A browser names the page a request comes from: refuse any other site's.
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise HTTPException(403, "cross-site request refused")
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            raise HTTPException(403, "cross-site request refused")
        form = await request.form()
        given = form.get("csrf")
        if not isinstance(given, str) or not hmac.compare_digest(given, csrf):
            raise HTTPException(403, "missing or wrong CSRF token")

    async def on_item(
        request: Request, action: Callable[[str, Any], bool], done: str, left: str
    ) -> Response:
        """POST ``action(worker, id)`` on one item, then back to its page saying what
        came of it (``done`` or ``left``)."""
        await check_post(request)
        worker = registered(request.path_params["worker"])
        key = source_id(worker, request.path_params["id"])
        from starlette.concurrency import run_in_threadpool

        changed = await run_in_threadpool(action, worker.name, key)
        message = done if changed else left
        url = request.url_for("item", worker=worker.name, id=request.path_params["id"])
        return RedirectResponse(f"{url}?message={_quote(message)}", status_code=303)

    async def retry_one(request: Request) -> Response:
        done = "reset: it runs again when eligible"
        return await on_item(request, operations.retry, done, "not failed: left alone")

    async def cancel_one(request: Request) -> Response:
        done = "cancelled: it does not run again unless retried"
        return await on_item(request, operations.cancel, done, "not open: left alone")

    async def retry_all(request: Request) -> Response:
        await check_post(request)
        worker = registered(request.path_params["worker"])
        from starlette.concurrency import run_in_threadpool

        reset = len(await run_in_threadpool(operations.retry_failed, worker.name))
        url = request.url_for("worker", worker=worker.name)
        return RedirectResponse(
            f"{url}?message={_quote(f'reset {reset} failed item(s)')}", status_code=303
        )

    routes = [
        Route("/", index, name="index"),
        Route("/workers/{worker}", worker_page, name="worker"),
        Route("/workers/{worker}/items/{id}", item_page, name="item"),
        Route("/workers/{worker}/items/{id}/retry", retry_one, methods=["POST"], name="retry"),
        Route("/workers/{worker}/items/{id}/cancel", cancel_one, methods=["POST"], name="cancel"),
        Route("/workers/{worker}/retry-failed", retry_all, methods=["POST"], name="retry_all"),
    ]

    async def error_page(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", "error")
        return PlainTextResponse(f"{status}: {detail}\n", status_code=status)

    app = Starlette(routes=routes, exception_handlers={HTTPException: error_page})
    guarded = _Guard(app, token)
    # Exposed for the CLI and tests, like Starlette's own app.state.
    app.state.csrf = csrf
    return guarded


def _shown(figures: Backlog) -> dict[str, Any]:
    """A worker's figures as the templates read them: counts by status name."""
    return {
        **dataclasses.asdict(figures),
        "counts": {status_name(status): n for status, n in figures.counts.items()},
    }


def _host_name(header: str) -> str:
    """The host of a Host header: ``127.0.0.1:8000`` -> ``127.0.0.1``, ``[::1]:80`` -> ``::1``."""
    return urlsplit(f"//{header}").hostname or ""


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text)


class _Guard:
    """ASGI middleware: the Host check (DNS rebinding) without a token, the access
    token with one (``Authorization: Bearer``, the cookie, or ``?token=`` once)."""

    def __init__(self, app: Starlette, token: str | None) -> None:
        self.app = app
        self.token = token
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse, RedirectResponse

        request = Request(scope, receive)
        if self.token is None:
            if not is_loopback(_host_name(request.headers.get("host", ""))):
                response: Any = PlainTextResponse(
                    "403: this dashboard answers only to localhost\n", status_code=403
                )
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        given = request.query_params.get("token")
        if given is not None and hmac.compare_digest(given, self.token):
            # Trade the token in the address for a cookie, and drop it from the address.
            query = "&".join(
                f"{k}={v}" for k, v in request.query_params.multi_items() if k != "token"
            )
            target = request.url.path + (f"?{query}" if query else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        bearer = request.headers.get("authorization", "")
        presented = bearer[7:] if bearer.lower().startswith("bearer ") else None
        presented = presented or request.cookies.get(TOKEN_COOKIE)
        if presented is None or not hmac.compare_digest(presented, self.token):
            response = PlainTextResponse(
                "401: this dashboard needs its access token (open it with ?token=...)\n",
                status_code=401,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def serve(
    coordinator: Coordinator,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    read_only: bool = False,
) -> None:
    """Serve the dashboard with uvicorn until interrupted."""
    check_binding(host, token)
    app = create_app(coordinator, token=token, read_only=read_only)
    try:
        import uvicorn
    except ImportError:
        raise ConfigurationError(
            "the dashboard needs uvicorn: pip install 'dbworker[dashboard]'"
        ) from None
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again under
    # the handlers it found: with these, a stop asked for is a clean exit (status 0).
    import signal
    import threading

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: None)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

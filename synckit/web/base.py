"""What the console's pages share: its configuration (:class:`WebConfig`), the state it
keeps (:class:`ConsoleState`), the guard (access token, read-only mode, CSRF and Origin
checks), rendering with the flash message, the action runner, and the presentation
filters and form readers every page uses."""

from __future__ import annotations

import json
import secrets as pysecrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import structlog
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from synckit.clock import parse_duration, utcnow
from synckit.errors.exceptions import SynckitError
from synckit.printable import printable
from synckit.runtime.admin import tenants as tenant_store
from synckit.runtime.observe.logging import redact, redact_text
from synckit.store.db import Database
from synckit.store.jobs import admin as job_admin
from synckit.store.jobs._base import INT64
from synckit.web.explain import duration_text
from synckit.web.paging import page_links
from synckit.web.security import (
    csrf_valid,
    host_refusal,
    origin_allowed,
    safe_next,
    token_valid,
)

if TYPE_CHECKING:
    from synckit.app import App

HERE = Path(__file__).parent
CSRF_COOKIE = "synckit_csrf"
TOKEN_COOKIE = "synckit_token"
FLASH_COOKIE = "synckit_flash"
BAD_MARK = "!"  # a flash message starting with it reports a failure
JOB_STATUSES = job_admin.JOB_STATUSES
OUTBOX_STATUSES = ("pending", "failed", "published")
log = structlog.get_logger("synckit.web")
T = TypeVar("T")


#: Where the provider sends the user back after consent (outside the token guard).
CALLBACK_PATH = "/oauth/callback"


@dataclass(frozen=True)
class WebConfig:
    """How the console runs: its database, the App (for sync now, record replays and the
    connectors' secret fields), the access token, read-only mode, live refresh period,
    and the public host names it answers to besides loopback ones (``allowed_hosts``)."""

    database_url: str | None
    app: App | None = None
    token: str | None = None
    read_only: bool = False
    refresh_seconds: float = 2.0
    allowed_hosts: tuple[str, ...] = ()


# --- presentation helpers ---------------------------------------------------------------


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "-"
    delta = (moment - (now or utcnow())).total_seconds()
    return f"in {duration_text(delta)}" if delta >= 0 else f"{duration_text(-delta)} ago"


def shown_json(value: Any) -> str:
    """Stored JSON for a page: secrets redacted by key and inside strings."""
    return json.dumps(redact(value), indent=2, sort_keys=True, default=str)


def red(text: Any) -> str:
    return redact_text(str(text)) if text is not None else ""


def shown_config(t: tenant_store.Tenant, app: App | None) -> dict[str, Any]:
    """A tenant's config as a page may show it: secrets masked by type (the values
    stored sealed, and what the connector's model types as secret), then redacted."""
    model = None
    if app is not None:
        try:
            model = app.connector(t.connector).config_model
        except SynckitError:
            model = None
    return tenant_store.shown_config(t, model)


def printable_value(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    shown = printable(str(value), keep_newlines=True)
    # Markup (safe HTML a filter made) stays Markup: Markup(text) does not escape it again.
    return type(value)(shown) if hasattr(value, "__html__") else shown


def make_env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
        # After HTML escaping, the other hostile text: control characters (an ESC, a
        # bidi override) in stored text are shown escaped, never passed on.
        finalize=printable_value,
    )
    env.filters["when"] = when
    env.filters["relative"] = relative
    env.filters["shown_json"] = shown_json
    env.filters["red"] = red
    env.filters["duration"] = duration_text
    return env


# --- the application --------------------------------------------------------------------


class ConsoleState:
    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.db: Database | None = None
        self.env = make_env()
        self.firing: tuple[datetime, list[Any], bool] | None = None
        # The attempts a job gets, by the worker's rule: a handler's max_attempts (known
        # with --app), else the row's, which the worker sets to the limit it applied.
        rule = getattr(getattr(config.app, "registry", None), "attempt_limit", None)
        self.limit_of: Callable[[str, int], int] = (
            rule if callable(rule) else (lambda _kind, stored: stored)
        )
        self.env.globals["limit_of"] = self.limit_of

    @property
    def database(self) -> Database:
        assert self.db is not None, "the console's lifespan has not started"
        return self.db


def state_of(request: Request) -> ConsoleState:
    st: ConsoleState = request.app.state.console
    return st


def who_of(request: Request) -> str:
    st = state_of(request)
    client = request.client.host if request.client else "?"
    return f"{'token' if st.config.token else 'local'}@{client}"


class Guard(BaseHTTPMiddleware):
    """Access token, read-only mode, CSRF and Origin checks, and the CSRF cookie."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        st = state_of(request)
        path = request.url.path
        bad_host = host_refusal(
            request.headers.get("host"), token=st.config.token, allowed=st.config.allowed_hosts
        )
        if bad_host is not None:
            log.warning("web.host_refused", host=request.headers.get("host", "")[:200])
            return PlainTextResponse(f"bad request: {bad_host}", status_code=400)
        # The OAuth callback is authorised by its state (see oauth_callback).
        public = path.startswith("/static/") or path in ("/login", CALLBACK_PATH)
        if not public and st.config.token:
            given = request.cookies.get(TOKEN_COOKIE)
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not token_valid(st.config.token, given):
                if request.method == "GET" and "hx-request" not in request.headers:
                    return RedirectResponse(
                        "/login?" + urlencode({"next": str(request.url.path)}), status_code=303
                    )
                return PlainTextResponse("access token required", status_code=401)
        if "\x00" in request.scope["path"] or any(
            "\x00" in k or "\x00" in v for k, v in request.query_params.multi_items()
        ):
            # No name, cursor or filter holds one, and PostgreSQL's text cannot: a 400
            # here, not a driver's error (a 500) in whichever query the value reaches.
            return PlainTextResponse("bad request: the URL holds a NUL character", 400)
        if request.method not in ("GET", "HEAD"):
            refusal = await self._refusal(request, st)
            if refusal is not None:
                log.warning("web.action_refused", path=path, reason=refusal, who=who_of(request))
                return PlainTextResponse(f"refused: {refusal}", status_code=403)
        response = await call_next(request)
        if not request.cookies.get(CSRF_COOKIE):
            response.set_cookie(CSRF_COOKIE, request.state.csrf, httponly=True, samesite="strict")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            # Inline style attributes draw the throughput bars; scripts stay same-origin.
            "default-src 'self'; img-src 'self' data:; "
            "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
        )
        return response

    async def _refusal(self, request: Request, st: ConsoleState) -> str | None:
        if not origin_allowed(request.headers.get("origin"), request.headers.get("host")):
            return "the request came from another site"
        submitted = request.headers.get("x-csrf-token")
        if submitted is None:
            # Read the body first: BaseHTTPMiddleware replays a read body to the endpoint,
            # a parsed form it does not.
            await request.body()
            form = await request.form()
            value = form.get("csrf")
            submitted = value if isinstance(value, str) else None
        if not csrf_valid(request.cookies.get(CSRF_COOKIE), submitted):
            return "missing or wrong CSRF token (reload the page and try again)"
        if st.config.read_only and request.url.path != "/login":
            return "the console runs read-only (--read-only)"
        return None


class CsrfSeed:
    """Pure ASGI: give each request the CSRF value its page embeds (the cookie's, or a
    new one the guard sets on the response)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            from starlette.requests import HTTPConnection

            conn = HTTPConnection(scope)
            scope.setdefault("state", {})
            scope["state"]["csrf"] = conn.cookies.get(CSRF_COOKIE) or pysecrets.token_urlsafe(32)
        await self.app(scope, receive, send)


def render(request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    st = state_of(request)
    flash = request.cookies.get(FLASH_COOKIE)
    flash_bad = bool(flash and flash.startswith(BAD_MARK))
    shown_flash = flash[len(BAD_MARK) :] if flash and flash_bad else flash
    html = st.env.get_template(template).render(
        request=request,
        csrf=request.state.csrf,
        read_only=st.config.read_only,
        has_app=st.config.app is not None,
        refresh=st.config.refresh_seconds,
        flash=shown_flash,
        flash_bad=flash_bad,
        now=utcnow(),
        **values,
    )
    response = HTMLResponse(html, status_code=status_code)
    if flash and "hx-request" not in request.headers:
        response.delete_cookie(FLASH_COOKIE)
    return response


def back(request: Request, form: Any, message: str, default: str, *, bad: bool = False) -> Response:
    target = safe_next(form.get("next") if form is not None else None, default)
    response = RedirectResponse(target, status_code=303)
    text = (BAD_MARK if bad else "") + message[:800]
    response.set_cookie(FLASH_COOKIE, text, max_age=30, httponly=True, samesite="strict")
    return response


class FailedOutcome(str):
    """An action's message that reports a failure (shown styled as an error)."""


def failed(message: str) -> FailedOutcome:
    return FailedOutcome(message)


async def act(
    request: Request,
    action: str,
    target: str,
    work: Callable[[], Awaitable[str]],
    *,
    default: str,
) -> Response:
    """Run one action, log who/what/when and its outcome, and go back with a message."""
    form = await request.form()
    who = who_of(request)
    try:
        message = await work()
    except (SynckitError, LookupError, ValueError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("web.action_failed", action=action, target=target, who=who, error=text)
        return back(request, form, f"{action} {target} failed: {text}", default, bad=True)
    bad = isinstance(message, FailedOutcome)
    log.info("web.action", action=action, target=target, who=who, outcome=message, failed=bad)
    return back(request, form, message, default, bad=bad)


def int_param(value: Any, bounds: tuple[int, int] = INT64) -> int | None:
    """``value`` as a whole number within ``bounds``, else None: a cursor or an id past
    the database's integers is no row, not a driver's overflow (a 500)."""
    try:
        n = int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
    return n if n is not None and bounds[0] <= n <= bounds[1] else None


def ids_of(form: Any) -> list[int]:
    out = []
    for raw in form.getlist("ids"):
        n = int_param(raw)
        if n is not None:
            out.append(n)
    return sorted(set(out))


class BadFilter(ValueError):
    """A filter in the query string that cannot be read (the page says which, in a line)."""


def since_param(text: str | None) -> datetime | None:
    """``since=10m`` as the moment it names; :class:`BadFilter` when it names none."""
    if not text:
        return None
    try:
        return utcnow() - parse_duration(text)
    except ValueError as exc:
        raise BadFilter(f"within {text[:40]!r}: {exc}") from None


def cursor_links(request: Request, name: str, cursor: str | None) -> dict[str, Any]:
    """The page's next and previous links (:func:`synckit.web.paging.page_links`)."""
    nxt, prev = page_links(request.query_params.multi_items(), name, cursor)
    return {"next_query": nxt, "prev_query": prev}


def query_values(request: Request, *names: str) -> list[str | None]:
    """The query parameters ``names``, in order, each None where absent or empty."""
    q = request.query_params
    return [q.get(name) or None for name in names]


def here_of(request: Request) -> str:
    """The page's own path with its query string (where its actions come back to)."""
    return str(request.url.path) + ("?" + request.url.query if request.url.query else "")


async def row_or_404(
    request: Request,
    param: str,
    fetch: Callable[[Database, int], Awaitable[T]],
    missing: type[SynckitError],
    what: str,
) -> T | HTMLResponse:
    """The row the path parameter ``param`` names, read by ``fetch``; or the 404 page when
    the id is not a number or ``fetch`` raises ``missing`` (``no {what} with id …``)."""
    raw = request.path_params[param]
    row_id = int_param(raw)
    try:
        if row_id is None:
            raise missing(f"no {what} with id {raw}")
        return await fetch(state_of(request).database, row_id)
    except missing as exc:
        return render(request, "error.html", status_code=404, message=str(exc))


def next_query(request: Request, name: str, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    params = {k: v for k, v in request.query_params.items() if k not in (name, "back") and v}
    params[name] = cursor
    return urlencode(params)

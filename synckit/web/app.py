"""The console's Starlette application: pages, live fragments and actions.

Server-rendered (Jinja2, autoescaped: stored text is data, never markup); live parts
are htmx fragments polled every couple of seconds; every change is a POST carrying the
CSRF token and goes through the same storage operation the CLI uses, then redirects
back (303) so a reload never repeats it. Secrets never reach a page: tenant configs are
masked by the connector's ``SecretStr`` fields and by key names, payloads and error
texts pass through the log redactor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets as pysecrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import structlog
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from synckit.clock import parse_duration, utcnow
from synckit.errors.exceptions import DeadLetterNotFound, JobNotFound, SynckitError, TenantNotFound
from synckit.printable import printable
from synckit.runtime.admin import tenants as tenant_store
from synckit.runtime.admin.audit import window_start
from synckit.runtime.observe.alert_delivery import recent_alerts
from synckit.runtime.observe.budget import BudgetPolicy, BudgetStatus
from synckit.runtime.observe.logging import redact, redact_text
from synckit.runtime.sync.poll import POLL_KIND, list_checkpoints
from synckit.runtime.writes import outbox as outbox_store
from synckit.store import console, pages, queue_history
from synckit.store import jobs as job_store
from synckit.store import workers as worker_store
from synckit.store.audit import Totals
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.dead_letters.rows import DlqFilter
from synckit.store.resources import get_resource, reset_resource
from synckit.web import webhook_events
from synckit.web.attempts import run_label, uncounted_runs
from synckit.web.explain import CycleFacts, duration_text, tenant_why
from synckit.web.paging import INTERNAL_KINDS, page_links
from synckit.web.security import (
    csrf_valid,
    host_refusal,
    origin_allowed,
    safe_next,
    token_valid,
)

if TYPE_CHECKING:
    from synckit.app import App

__all__ = ["CSRF_COOKIE", "TOKEN_COOKIE", "WebConfig", "create_app"]

HERE = Path(__file__).parent
CSRF_COOKIE = "synckit_csrf"
TOKEN_COOKIE = "synckit_token"
FLASH_COOKIE = "synckit_flash"
BAD_MARK = "!"  # a flash message starting with it reports a failure
JOB_STATUSES = job_store.JOB_STATUSES
OUTBOX_STATUSES = ("pending", "failed", "published")
log = structlog.get_logger("synckit.web")


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


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def _relative(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "-"
    delta = (moment - (now or utcnow())).total_seconds()
    return f"in {duration_text(delta)}" if delta >= 0 else f"{duration_text(-delta)} ago"


def _shown_json(value: Any) -> str:
    """Stored JSON for a page: secrets redacted by key and inside strings."""
    return json.dumps(redact(value), indent=2, sort_keys=True, default=str)


def _red(text: Any) -> str:
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


def _printable(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    shown = printable(str(value), keep_newlines=True)
    # Markup (safe HTML a filter made) stays Markup: Markup(text) does not escape it again.
    return type(value)(shown) if hasattr(value, "__html__") else shown


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
        # After HTML escaping, the other hostile text: control characters (an ESC, a
        # bidi override) in stored text are shown escaped, never passed on.
        finalize=_printable,
    )
    env.filters["when"] = _when
    env.filters["relative"] = _relative
    env.filters["shown_json"] = _shown_json
    env.filters["red"] = _red
    env.filters["duration"] = duration_text
    return env


# --- the application --------------------------------------------------------------------


class _State:
    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.db: Database | None = None
        self.env = _env()
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


def _state(request: Request) -> _State:
    st: _State = request.app.state.console
    return st


def _who(request: Request) -> str:
    st = _state(request)
    client = request.client.host if request.client else "?"
    return f"{'token' if st.config.token else 'local'}@{client}"


class _Guard(BaseHTTPMiddleware):
    """Access token, read-only mode, CSRF and Origin checks, and the CSRF cookie."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        st = _state(request)
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
                log.warning("web.action_refused", path=path, reason=refusal, who=_who(request))
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

    async def _refusal(self, request: Request, st: _State) -> str | None:
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


class _CsrfSeed:
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
    st = _state(request)
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


def _back(
    request: Request, form: Any, message: str, default: str, *, bad: bool = False
) -> Response:
    target = safe_next(form.get("next") if form is not None else None, default)
    response = RedirectResponse(target, status_code=303)
    text = (BAD_MARK if bad else "") + message[:800]
    response.set_cookie(FLASH_COOKIE, text, max_age=30, httponly=True, samesite="strict")
    return response


class FailedOutcome(str):
    """An action's message that reports a failure (shown styled as an error)."""


def failed(message: str) -> FailedOutcome:
    return FailedOutcome(message)


async def _act(
    request: Request,
    action: str,
    target: str,
    work: Callable[[], Awaitable[str]],
    *,
    default: str,
) -> Response:
    """Run one action, log who/what/when and its outcome, and go back with a message."""
    form = await request.form()
    who = _who(request)
    try:
        message = await work()
    except (SynckitError, LookupError, ValueError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("web.action_failed", action=action, target=target, who=who, error=text)
        return _back(request, form, f"{action} {target} failed: {text}", default, bad=True)
    bad = isinstance(message, FailedOutcome)
    log.info("web.action", action=action, target=target, who=who, outcome=message, failed=bad)
    return _back(request, form, message, default, bad=bad)


def _int(value: Any, bounds: tuple[int, int] = job_store.INT64) -> int | None:
    """``value`` as a whole number within ``bounds``, else None: a cursor or an id past
    the database's integers is no row, not a driver's overflow (a 500)."""
    try:
        n = int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
    return n if n is not None and bounds[0] <= n <= bounds[1] else None


def _ids(form: Any) -> list[int]:
    out = []
    for raw in form.getlist("ids"):
        n = _int(raw)
        if n is not None:
            out.append(n)
    return sorted(set(out))


class BadFilter(ValueError):
    """A filter in the query string that cannot be read (the page says which, in a line)."""


def _since(text: str | None) -> datetime | None:
    """``since=10m`` as the moment it names; :class:`BadFilter` when it names none."""
    if not text:
        return None
    try:
        return utcnow() - parse_duration(text)
    except ValueError as exc:
        raise BadFilter(f"within {text[:40]!r}: {exc}") from None


# --- overview ---------------------------------------------------------------------------


async def overview(request: Request) -> Response:
    return render(request, "overview.html", **await _overview_values(request))


async def overview_live(request: Request) -> Response:
    return render(request, "_overview_live.html", **await _overview_values(request))


def _budget_burners(
    tenants: list[tuple[str, Totals]], policy: BudgetPolicy, limit: int = 10
) -> list[tuple[str, BudgetStatus]]:
    """The ``limit`` tenants burning their error budget fastest, each with its status."""
    burning = [(t, policy.status(totals)) for t, totals in tenants]
    burning.sort(key=lambda x: (-x[1].burn, x[0]))
    return burning[:limit]


#: How far back the overview's charts go.
HISTORY_MINUTES = 180
#: How long the overview reuses one evaluation of the alert rules (every open page
#: refreshes every few seconds; the rules read every tenant).
FIRING_TTL = timedelta(seconds=15)


async def _firing(st: _State, now: datetime) -> tuple[list[Any], bool]:
    """The alerts firing now, by the rules ``synckit status`` evaluates on the spot (the
    same figures, so both agree); False when there are too many tenants to evaluate."""
    from synckit.runtime.admin.status import ALERTS_ON_THE_SPOT
    from synckit.runtime.observe.alert_rules import RuleSet
    from synckit.runtime.observe.alerts import load_alert_data

    cached = st.firing
    if cached is not None and now - cached[0] < FIRING_TTL:
        return cached[1], cached[2]
    rules = RuleSet()
    async with st.database.read() as conn:
        tenants = sum((await console.tenant_counts(conn)).values())
        evaluate = tenants <= ALERTS_ON_THE_SPOT
        data = await load_alert_data(conn, now=now, rules=rules) if evaluate else None
    firing = rules.evaluate(data) if data is not None else []
    st.firing = (now, firing, data is not None)
    return firing, data is not None


async def _overview_values(request: Request) -> dict[str, Any]:
    """The overview's figures, each read at a bounded cost (see
    :mod:`synckit.store.console`): it is
    refreshed every few seconds by every open page, on tables of any size."""
    db = _state(request).database
    now = utcnow()
    cap = pages.COUNT_CAP
    async with db.read() as conn:
        jobs_by_state = await console.job_counts(conn, cap=cap)
        per_minute = await console.throughput(conn, now=now, minutes=HISTORY_MINUTES)
        depths = await queue_history.history(conn, now=now, minutes=HISTORY_MINUTES)
        growth = await console.dlq_growth(conn, now=now, cap=cap)
        dlq_open = await console.dlq_open(conn, cap=cap)
        outbox_pending = await console.outbox_pending(conn, cap=cap)
        tenant_states = await console.tenant_counts(conn)
        breakers, breaker_count = await console.open_breakers(conn, cap=cap)
        burning = _budget_burners(await console.burning_tenants(conn, now=now), BudgetPolicy())
        # A quiet hour costs an index probe of ix_alerts_fired_at.
        alerts = await recent_alerts(conn, since=now - timedelta(hours=1), limit=20)
    firing, evaluated = await _firing(_state(request), now)
    seen = await worker_store.list_workers(db, now=now)
    peak = max([ok + failed + paced for _m, ok, failed, paced in per_minute] + [1])
    return {
        "per_minute": per_minute,
        "depths": depths,
        "depth_series": queue_history.SERIES,
        "depth_peak": max([q.depth for _m, q in depths if q is not None] + [1]),
        "history_hours": HISTORY_MINUTES // 60,
        "peak": peak,
        "last_hour": sum(ok + failed for _m, ok, failed, _p in per_minute[-60:]),
        "firing": firing,
        "alerts_evaluated": evaluated,
        "workers_alive": sum(1 for w in seen if w.state == "alive"),
        "workers_lost": sum(1 for w in seen if w.state == "lost"),
        "growth": growth,
        "dlq_open": dlq_open,
        "outbox_pending": outbox_pending,
        "tenant_states": tenant_states,
        "jobs_by_state": jobs_by_state,
        "depth": jobs_by_state["pending"] + jobs_by_state["running"],
        "burning": burning,
        "open_breakers": breakers,
        "breaker_count": breaker_count,
        "alerts": alerts,
        "statuses": JOB_STATUSES,
        "cap": cap,
    }


# --- tenants ----------------------------------------------------------------------------


async def tenants_page(request: Request) -> Response:
    db = _state(request).database
    q = request.query_params
    page = await console.tenant_page(
        db,
        status=q.get("status") or None,
        connector=q.get("connector") or None,
        after=q.get("after") or None,
        prefix=q.get("prefix") or None,
    )
    total = await console.tenant_total(
        db,
        status=q.get("status") or None,
        connector=q.get("connector") or None,
        prefix=q.get("prefix") or None,
    )
    running = await job_store.running_counts(db, [t.resource_key for t in page.rows])
    now = utcnow()
    rows = [
        (
            t,
            tenant_why(
                status=t.status,
                status_reason=_red(t.status_reason) or None,
                breaker=t.breaker,
                cooldown_until=t.cooldown_until,
                next_available_at=t.next_available_at,
                paced_reason=t.paced_reason,
                max_in_flight=t.max_in_flight,
                running=running.get(t.resource_key, 0),
                now=now,
            ),
        )
        for t in page.rows
    ]
    return render(
        request,
        "tenants.html",
        rows=rows,
        page=page,
        filters={k: q.get(k, "") for k in ("status", "connector", "prefix")},
        total=total,
        **_links(request, "after", page.next_cursor),
    )


def _links(request: Request, name: str, cursor: str | None) -> dict[str, Any]:
    """The page's next and previous links (:func:`synckit.web.paging.page_links`)."""
    nxt, prev = page_links(request.query_params.multi_items(), name, cursor)
    return {"next_query": nxt, "prev_query": prev}


def _next_query(request: Request, name: str, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    params = {k: v for k, v in request.query_params.items() if k not in (name, "back") and v}
    params[name] = cursor
    return urlencode(params)


async def _tenant_values(request: Request) -> dict[str, Any]:
    st = _state(request)
    db = st.database
    name = request.path_params["tenant"]
    t = await tenant_store.get_tenant(db, name, reveal=False)
    now = utcnow()
    try:
        resource = await get_resource(db, t.resource_key)
    except LookupError:
        resource = None
    row = await console.tenant_row(db, t.tenant)
    running = (await job_store.running_counts(db, [t.resource_key])).get(t.resource_key, 0)
    cycles = await job_store.poll_jobs(db, t.resource_key, t.tenant, kind=POLL_KIND)
    why = tenant_why(
        cycle=cycle_facts(cycles[0], st.limit_of(POLL_KIND, cycles[0].max_attempts))
        if cycles
        else None,
        scheduled=await console.has_schedule(db, t.tenant),
        workers_alive=await worker_store.alive_count(db, now=now),
        status=t.status,
        status_reason=_red(t.status_reason) or None,
        breaker=row.breaker if row else "closed",
        cooldown_until=row.cooldown_until if row else None,
        next_available_at=row.next_available_at if row else None,
        paced_reason=row.paced_reason if row else None,
        max_in_flight=row.max_in_flight if row else None,
        running=running,
        now=now,
    )
    checkpoints = await list_checkpoints(db, t.tenant)
    dlq = await tenant_store.dead_letter_counts(db, t.tenant)
    policy = BudgetPolicy()
    totals = await console.tenant_totals(db, t.tenant, since=window_start(now, policy.window))
    budget = policy.status(totals) if totals.operations else None
    return {
        "t": t,
        "config": shown_config(t, st.config.app),
        "resource": resource,
        "running": running,
        "why": why,
        "checkpoints": [
            (stream, cursor, at, (now - at).total_seconds())
            for _c, stream, cursor, at in checkpoints
        ],
        "cycles": cycles,
        "dlq": dlq,
        "budget": budget,
    }


def cycle_facts(job: job_store.JobInfo, limit: int | None = None) -> CycleFacts:
    """A cycle job as :func:`~synckit.web.explain.tenant_why` reads it (error redacted);
    ``limit``: the attempts the worker gives it, when known beyond the row's."""
    return CycleFacts(
        id=job.id,
        status=job.status,
        run_at=job.run_at,
        attempts=job.attempts,
        max_attempts=job.max_attempts if limit is None else limit,
        last_error=_red(job.last_error) or None,
        error_class=job.error_class,
    )


async def tenant_page(request: Request) -> Response:
    try:
        values = await _tenant_values(request)
    except TenantNotFound as exc:
        return render(request, "error.html", status_code=404, message=str(exc))
    return render(request, "tenant.html", **values)


async def tenant_live(request: Request) -> Response:
    try:
        values = await _tenant_values(request)
    except TenantNotFound as exc:
        return PlainTextResponse(printable(str(exc)), status_code=404)
    return render(request, "_tenant_live.html", **values)


async def tenant_action(request: Request) -> Response:
    st = _state(request)
    db = st.database
    name = request.path_params["tenant"]
    action = request.path_params["action"]
    home = f"/tenants/{name}"

    async def pause() -> str:
        t = await tenant_store.pause_tenant(db, name, f"paused in the console by {_who(request)}")
        return f"{t.tenant} paused"

    async def resume() -> str:
        t = await tenant_store.resume_tenant(db, name)
        return f"{t.tenant} resumed"

    async def sync() -> str:
        if st.config.app is None:
            raise ValueError("sync now needs the App: start the console with --app")
        from synckit.runtime.admin.actions import enqueue_cycles

        _connector, cycles = await enqueue_cycles(db, st.config.app, name)
        return "; ".join(
            f"{c.stream}: cycle {'enqueued' if c.created else 'already queued'} (job {c.job_id})"
            for c in cycles
        )

    async def reset() -> str:
        t = await tenant_store.get_tenant(db, name, reveal=False)
        await reset_resource(db, t.resource_key)
        return f"{t.tenant}: breaker closed and pacing cleared ({t.resource_key})"

    actions = {"pause": pause, "resume": resume, "sync": sync, "reset": reset}
    work = actions.get(action)
    if work is None:
        return PlainTextResponse(f"unknown tenant action {action!r}", status_code=404)
    return await _act(request, f"tenant.{action}", name, work, default=home)


CALLBACK_PATH = "/oauth/callback"


async def tenant_reauthorize(request: Request) -> Response:
    """Start the connect flow ``synckit tenants connect`` runs: the connector's
    ``OAuth2Config``, a stored PKCE verifier and state, the provider's consent URL shown
    as a link. The provider sends the browser back to this console's
    :data:`CALLBACK_PATH`, which completes the flow. A connector without OAuth is told
    what to do instead (``synckit tenants set-config``)."""
    st = _state(request)
    db = st.database
    name = request.path_params["tenant"]
    who = _who(request)
    form = await request.form()
    redirect_uri = str(request.base_url).rstrip("/") + CALLBACK_PATH
    try:
        from synckit.runtime.admin.actions import oauth_config_for
        from synckit.runtime.credentials.authorize import DEFAULT_TTL, begin_authorization

        t = await tenant_store.get_tenant(db, name, reveal=False)
        if st.config.app is None:
            raise ValueError(
                "re-authorising needs the App (its connector's OAuth settings): start the "
                f"console with --app, or run `synckit tenants connect {t.tenant} --app ...`"
            )
        config = await oauth_config_for(st.config.app, db, t.tenant)
        url = await begin_authorization(db, t.tenant, config, redirect_uri=redirect_uri)
    except (SynckitError, LookupError, ValueError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning(
            "web.action_failed", action="tenant.reauthorize", target=name, who=who, error=text
        )
        return _back(request, form, f"re-authorise {name}: {text}", f"/tenants/{name}")
    log.info(
        "web.action",
        action="tenant.reauthorize",
        target=t.tenant,
        who=who,
        outcome=f"consent URL issued, redirect to {redirect_uri}",
    )
    values = await _tenant_values(request)
    consent = {
        "url": url,
        "redirect_uri": redirect_uri,
        "ttl": duration_text(DEFAULT_TTL.total_seconds()),
    }
    return render(request, "tenant.html", consent=consent, **values)


async def oauth_callback(request: Request) -> Response:
    """Where the provider sends the browser back: completes the connect flow begun by
    :func:`tenant_reauthorize` (``complete_authorization``), once per ``state``.

    It needs no access token: a browser coming back from another site does not carry
    the console's SameSite cookies, and what authorises the request is its ``state``,
    unguessable, issued by an operator's POST, bound to one tenant, used once and
    expired after minutes."""
    st = _state(request)
    db = st.database
    client = request.client.host if request.client else "?"
    who = f"oauth-callback@{client}"
    state = request.query_params.get("state") or ""
    tenant = await console.authorization_tenant(db, state[:200]) if state else None
    if tenant is None:
        log.warning("web.action_refused", path=CALLBACK_PATH, reason="unknown state", who=who)
        return render(
            request,
            "connected.html",
            status_code=400,
            tenant=None,
            error="this callback's state is unknown (not issued by this console, or forged): "
            "start again with Re-authorise on the tenant's page",
        )
    try:
        from synckit.runtime.admin.actions import oauth_config_for
        from synckit.runtime.credentials.authorize import complete_authorization

        if st.config.read_only:
            raise ValueError("the console runs read-only (--read-only)")
        if st.config.app is None:
            raise ValueError("completing a connection needs the App: start the console with --app")
        config = await oauth_config_for(st.config.app, db, tenant)
        result = await complete_authorization(db, tenant, config, str(request.url))
    except (SynckitError, LookupError, ValueError) as exc:
        text = _red(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        log.warning(
            "web.action_failed", action="tenant.connect", target=tenant, who=who, error=text
        )
        return render(request, "connected.html", status_code=400, tenant=tenant, error=text)
    log.info(
        "web.action",
        action="tenant.connect",
        target=tenant,
        who=who,
        outcome=f"connected, was {result.previous_status}",
    )
    return render(request, "connected.html", tenant=tenant, result=result, error=None)


# --- jobs -------------------------------------------------------------------------------


def _job_filter(request: Request) -> job_store.JobFilter:
    q = request.query_params
    resource_key = q.get("resource") or None
    return job_store.JobFilter(
        kind=q.get("kind") or None,
        status=q.get("status") or None,
        resource_key=resource_key,
        created_since=_since(q.get("since")),
        hidden_kinds=() if q.get("internal") else INTERNAL_KINDS,
    )


async def jobs_page(request: Request) -> Response:
    db = _state(request).database
    q = request.query_params
    try:
        flt = _job_filter(request)
    except BadFilter as exc:
        return _refused_filter(request, "jobs.html", exc, statuses=JOB_STATUSES, here="/jobs")
    if q.get("tenant") and not flt.resource_key:
        try:
            t = await tenant_store.get_tenant(db, q["tenant"], reveal=False)
            flt = dataclasses.replace(flt, resource_key=t.resource_key)
        except TenantNotFound:
            # Named, not queried: the old sentinel key ("\x00...") was a driver error on
            # PostgreSQL, whose text cannot hold a NUL.
            missing = BadFilter(f"no tenant {q['tenant']!r}")
            return _refused_filter(
                request, "jobs.html", missing, statuses=JOB_STATUSES, here="/jobs"
            )
    page = await job_store.job_page(db, flt, before_id=_int(q.get("before")))
    return render(
        request,
        "jobs.html",
        page=page,
        scan_window=pages.SCAN_WINDOW,
        statuses=JOB_STATUSES,
        filters={
            k: q.get(k, "") for k in ("kind", "status", "tenant", "resource", "since", "internal")
        },
        total=await job_store.count_jobs(db, flt),
        hidden=flt.hides,
        show_internal=urlencode(
            [(k, v) for k, v in q.multi_items() if k not in ("before", "back") and v]
            + [("internal", "1")]
        ),
        **_links(request, "before", page.next_cursor),
        here=str(request.url.path) + ("?" + request.url.query if request.url.query else ""),
    )


async def job_page(request: Request) -> Response:
    db = _state(request).database
    raw = request.path_params["job_id"]
    job_id = _int(raw)
    try:
        if job_id is None:
            raise JobNotFound(f"no job with id {raw}")
        info = await job_store.get_job(db, job_id)
    except JobNotFound as exc:
        return render(request, "error.html", status_code=404, message=str(exc))
    limit = _state(request).limit_of(info.kind, info.max_attempts)
    timeline: list[tuple[str, datetime | None, str]] = [("created", info.created_at, "")]
    labels = [run_label(e, i, limit) for i, e in enumerate(info.errors, 1)]
    for e, label in zip(info.errors, labels, strict=True):
        timeline.append(
            (
                label,
                _parse_at(e.get("at")),
                f"{e.get('error_class', '')}: {e.get('message', e.get('error', ''))}",
            )
        )
    if info.finished_at:
        timeline.append((info.status, info.finished_at, ""))
    return render(
        request,
        "job.html",
        job=info,
        limit=limit,
        uncounted=uncounted_runs(info.errors),
        labels=labels,
        timeline=timeline,
    )


def _parse_at(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value)
    return None


async def jobs_action(request: Request) -> Response:
    db = _state(request).database
    form = await request.form()
    action = str(form.get("action") or "")
    ids = _ids(form)
    default = "/jobs"

    async def work() -> str:
        if not ids:
            raise ValueError("no job selected")
        change: Callable[[int], Awaitable[Any]]
        if action == "retry":
            change = lambda i: job_store.retry_job(db, i)  # noqa: E731
        elif action == "cancel":
            change = lambda i: job_store.cancel_job(  # noqa: E731
                db, i, f"cancelled in the console by {_who(request)}"
            )
        elif action == "reschedule":
            delay = parse_duration(str(form.get("delay") or "0"))
            when = utcnow() + delay
            change = lambda i: job_store.reschedule_job(db, i, when)  # noqa: E731
        elif action == "priority":
            priority = _int(form.get("priority"))
            if priority is None:
                raise ValueError("priority must be a whole number")
            # Its range is set_priority's to check (a refusal per job, named).
            change = lambda i: job_store.set_priority(db, i, priority)  # noqa: E731
        else:
            raise ValueError(f"unknown job action {action!r}")
        done, refused = [], []
        for i in ids:
            try:
                await change(i)
                done.append(i)
            except SynckitError as exc:
                refused.append(f"{i}: {exc}")
        text = f"{action}: {len(done)} job(s) done"
        if refused:
            text += f"; {len(refused)} refused ({'; '.join(refused[:5])})"
        return failed(text) if refused else text

    return await _act(
        request, f"jobs.{action}", ",".join(map(str, ids[:20])), work, default=default
    )


# --- dead letters -----------------------------------------------------------------------


def _dlq_filter(params: Any) -> DlqFilter:
    def many(name: str) -> tuple[str, ...]:
        values = params.getlist(name) if hasattr(params, "getlist") else [params.get(name)]
        return tuple(v for v in values if v)

    return DlqFilter(
        tenants=many("tenant"),
        error_classes=many("class"),
        kinds=many("kind"),
        statuses=tuple(s for s in many("status") if s in dlq_rows.STATUSES),
        since=_since(params.get("since")),
    )


def _refused_filter(request: Request, template: str, exc: BadFilter, **values: Any) -> Response:
    """The page with nothing listed and the unreadable filter named, answered 400."""
    q = request.query_params
    empty: pages.Page[Any] = pages.Page([], None)
    return render(
        request,
        template,
        status_code=400,
        problem=str(exc),
        page=empty,
        groups=empty,
        groups_next=None,
        next_query=None,
        prev_query=None,
        total=None,
        hidden=(),
        export_query="",
        scan_window=pages.SCAN_WINDOW,
        filters={
            k: q.get(k, "") for k in ("kind", "status", "tenant", "resource", "since", "class")
        },
        **values,
    )


async def dlq_page(request: Request) -> Response:
    db = _state(request).database
    q = request.query_params
    try:
        flt = _dlq_filter(q)
    except BadFilter as exc:
        return _refused_filter(request, "dlq.html", exc, statuses=dlq_rows.STATUSES, here="/dlq")
    open_flt = flt if flt.statuses else flt.narrowed(("pending", "review"))
    groups = await dlq_reads.dlq_groups(
        db,
        open_flt,
        after=q.get("groups_after") or None,
        recent_since=utcnow() - timedelta(hours=24),
    )
    page = await dlq_reads.dlq_page(db, flt, before_id=_int(q.get("before")))
    # Every matching row, for the actions on all of them (only once a filter narrows
    # them: acting on the whole table is not one click away).
    matching = await dlq_reads.count(db, flt) if not flt.is_empty else None
    return render(
        request,
        "dlq.html",
        matching=matching,
        scan_window=pages.SCAN_WINDOW,
        groups=groups,
        groups_next=_next_query(request, "groups_after", groups.next_cursor),
        page=page,
        statuses=dlq_rows.STATUSES,
        filters={k: q.get(k, "") for k in ("tenant", "class", "kind", "status", "since")},
        total=await console.dlq_total(db, flt),
        **_links(request, "before", page.next_cursor),
        export_query=urlencode(
            {k: v for k, v in q.items() if k not in ("before", "groups_after") and v}
        ),
        here=str(request.url.path) + ("?" + request.url.query if request.url.query else ""),
    )


async def dlq_row_page(request: Request) -> Response:
    db = _state(request).database
    raw = request.path_params["row_id"]
    row_id = _int(raw)
    try:
        if row_id is None:
            raise DeadLetterNotFound(f"no dead letter with id {raw}")
        row = await dlq_reads.get(db, row_id)
    except DeadLetterNotFound as exc:
        return render(request, "error.html", status_code=404, message=str(exc))
    return render(request, "dlq_row.html", row=row)


async def dlq_action(request: Request) -> Response:
    st = _state(request)
    db = st.database
    form = await request.form()
    action = str(form.get("action") or "")
    ids = _ids(form)
    group_tenant = form.get("group_tenant")
    group_class = form.get("group_class")
    problem: str | None = None
    try:
        shown = _dlq_filter(form)  # the page's filter, which every group and row obeys
    except BadFilter as exc:
        shown, problem = DlqFilter(), str(exc)
    expected = _int(form.get("expected"))
    if ids:
        flt = DlqFilter(ids=tuple(ids))
        target = "ids " + ",".join(map(str, ids[:20]))
    elif isinstance(group_tenant, str) and isinstance(group_class, str):
        # The group as the page showed it: its tenant and class within the page's filter
        # (kind, status, within), open rows unless a status was chosen.
        flt = dataclasses.replace(
            shown if shown.statuses else shown.narrowed(("pending", "review")),
            tenants=(group_tenant,),
            error_classes=(group_class,),
        )
        target = f"group {group_tenant or '(none)'}/{group_class}"
    elif form.get("scope") == "filter" and not shown.is_empty:
        flt = shown
        target = "filter " + urlencode(
            {
                k: v
                for k, v in form.multi_items()
                if k in ("tenant", "class", "kind", "status", "since")
            }
        )
    else:
        flt = DlqFilter()
        target = "nothing"

    async def work() -> str:
        if problem is not None:
            raise ValueError(problem)
        if flt.is_empty:
            raise ValueError("no dead letter selected")
        if expected is not None and not ids:
            now_matching = await dlq_reads.count(db, flt)
            if now_matching != expected:
                return failed(
                    f"nothing done: {now_matching} row(s) match now, not the {expected} shown "
                    "(the rows changed meanwhile); look again and repeat"
                )
        reason = f"{action} in the console by {_who(request)}"
        if action == "resolve":
            n = await dlq_replay.resolve_matching(db, flt, reason=reason, now=utcnow())
            return f"{n} dead letter(s) resolved"
        if action == "ignore":
            n = await dlq_replay.ignore_matching(db, flt, reason=reason, now=utcnow())
            return f"{n} dead letter(s) ignored"
        if action == "replay":
            text, bad = replay_message(await _replay(st, db, flt))
            return failed(text) if bad else text
        raise ValueError(f"unknown dead-letter action {action!r}")

    return await _act(request, f"dlq.{action}", target, work, default="/dlq")


def replay_message(summary: Any) -> tuple[str, bool]:
    """What a replay did, in words, outcome by outcome with the reasons; and whether it
    reads as a failure (rows left unchanged because of configuration, or nothing run)."""
    from synckit.dlq.replay import ReplaySummary

    assert isinstance(summary, ReplaySummary)
    if not summary.claimed:
        return "replay: no pending or review dead letter matched: nothing to replay", True
    words = {
        "resolved": "replayed and resolved",
        "not_rerun": "resolved without re-run",
        "retry": "failed again, retry scheduled",
        "review": "failed again, sent to review",
        "ignored": "ignored",
        "deferred": "deferred",
        "skipped": "not replayed",
        "blocked": "NOT replayed, left unchanged",
    }
    why: dict[str, list[str]] = {}
    for (outcome, reason), n in sorted(summary.reasons.items(), key=lambda kv: -kv[1]):
        why.setdefault(outcome, []).append(f"{n}: {_red(reason)}" if n > 1 else _red(reason))
    parts = []
    for outcome, word in words.items():
        n = getattr(summary, outcome)
        if n:
            reasons = why.get(outcome, [])
            shown = f" ({'; '.join(reasons[:3])}{'; ...' if len(reasons) > 3 else ''})"
            parts.append(f"{n} {word}{shown if reasons else ''}")
    settled = summary.resolved + summary.not_rerun + summary.retry + summary.review
    bad = bool(summary.blocked) or not (settled + summary.ignored + summary.deferred)
    return f"replay of {summary.claimed} dead letter(s): " + "; ".join(parts), bad


async def _replay(st: _State, db: Database, flt: DlqFilter) -> Any:
    """What ``synckit dlq replay`` does: with the App, its replayers; without, dead jobs
    are re-run and record rows are skipped as needing the App."""
    from synckit.dlq.replay import ReplayProcessor, replayers_from_app
    from synckit.runtime.admin.actions import NO_APP_REASON

    if st.config.app is None:
        processor = ReplayProcessor(
            db, missing_replayer="skip", skip_reason=NO_APP_REASON, timeout=60.0
        )
    else:
        replayers, registry = replayers_from_app(st.config.app, db)
        processor = ReplayProcessor(db, replayers, registry=registry, timeout=60.0)
    return await processor.replay_matching(flt)


async def dlq_export(request: Request) -> Response:
    """Matching rows as JSON lines, streamed page by page, secrets redacted."""
    db = _state(request).database
    try:
        flt = _dlq_filter(request.query_params)
    except BadFilter as exc:
        return PlainTextResponse(printable(str(exc)), status_code=400)
    log.info("web.export", what="dlq", who=_who(request))

    async def lines() -> AsyncIterator[bytes]:
        async for row in dlq_reads.iter_rows(db, flt, full=True):
            yield (json.dumps(redact(row.to_json()), sort_keys=True, default=str) + "\n").encode()

    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": 'attachment; filename="dead-letters.jsonl"'},
    )


# --- outbox -----------------------------------------------------------------------------


async def outbox_page(request: Request) -> Response:
    db = _state(request).database
    q = request.query_params
    page = await console.outbox_page(
        db,
        status=q.get("status") or None,
        topic=q.get("topic") or None,
        key=q.get("key") or None,
        before_id=_int(q.get("before")),
    )
    return render(
        request,
        "outbox.html",
        page=page,
        topics=await console.outbox_topics(db),
        counts=await outbox_store.count_by_status(db),
        statuses=OUTBOX_STATUSES,
        filters={k: q.get(k, "") for k in ("status", "topic", "key")},
        total=await console.outbox_total(
            db,
            status=q.get("status") or None,
            topic=q.get("topic") or None,
            key=q.get("key") or None,
        ),
        **_links(request, "before", page.next_cursor),
        here=str(request.url.path) + ("?" + request.url.query if request.url.query else ""),
    )


async def outbox_action(request: Request) -> Response:
    db = _state(request).database
    form = await request.form()
    ids = _ids(form)
    topic = form.get("topic")

    async def work() -> str:
        if ids:
            n = await outbox_store.retry_messages(db, ids)
        elif isinstance(topic, str) and topic:
            n = await outbox_store.retry_failed(db, topic=topic)
        else:
            raise ValueError("no message selected")
        return f"{n} outbox message(s) back to pending"

    target = ",".join(map(str, ids[:20])) if ids else f"topic {topic}"
    return await _act(request, "outbox.retry", target, work, default="/outbox")


# --- workers ----------------------------------------------------------------------------


async def _workers_values(request: Request) -> dict[str, Any]:
    found = await worker_store.list_workers(_state(request).database, now=utcnow())
    return {"workers": found, "alive": sum(1 for w in found if w.state == "alive")}


async def workers_page(request: Request) -> Response:
    return render(request, "workers.html", **await _workers_values(request))


async def workers_live(request: Request) -> Response:
    return render(request, "_workers_live.html", **await _workers_values(request))


# --- login ------------------------------------------------------------------------------


async def login(request: Request) -> Response:
    st = _state(request)
    nxt = safe_next(request.query_params.get("next"))
    if request.method == "GET":
        return render(request, "login.html", next=nxt, failed=False)
    form = await request.form()
    given = form.get("token")
    nxt = safe_next(str(form.get("next") or "/"))
    if not st.config.token or not token_valid(
        st.config.token, given if isinstance(given, str) else None
    ):
        log.warning("web.login_failed", who=_who(request))
        return render(request, "login.html", status_code=401, next=nxt, failed=True)
    response = RedirectResponse(nxt, status_code=303)
    response.set_cookie(
        TOKEN_COOKIE, str(given), httponly=True, samesite="strict", max_age=12 * 3600
    )
    log.info("web.login", who=_who(request))
    return response


# --- assembly ---------------------------------------------------------------------------


def create_app(config: WebConfig, *, database: Database | None = None) -> Starlette:
    """The console as an ASGI application.

    The database is opened when the app starts (in the server's event loop) and
    disposed of when it stops; ``database`` gives one the caller owns instead.
    """
    state = _State(config)
    # A database the caller owns serves at once (also without a lifespan, as under
    # httpx's ASGITransport).
    state.db = database

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if database is not None:
            state.db = database
            yield
            return
        db = open_database(config.database_url)
        try:
            await db.check_schema()
            state.db = db
            yield
        finally:
            state.db = None
            await db.dispose()

    routes = [
        Route("/", overview),
        Route("/live/overview", overview_live),
        Route("/tenants", tenants_page),
        Route("/tenants/{tenant}", tenant_page),
        Route("/live/tenants/{tenant}", tenant_live),
        Route("/tenants/{tenant}/reauthorize", tenant_reauthorize, methods=["POST"]),
        Route("/tenants/{tenant}/{action}", tenant_action, methods=["POST"]),
        Route("/jobs", jobs_page),
        Route("/jobs/action", jobs_action, methods=["POST"]),
        Route("/jobs/{job_id:int}", job_page),
        Route("/dlq", dlq_page),
        Route("/dlq/action", dlq_action, methods=["POST"]),
        Route("/dlq/export", dlq_export),
        Route("/dlq/{row_id:int}", dlq_row_page),
        Route("/outbox", outbox_page),
        Route("/workers", workers_page),
        *webhook_events.routes(),
        Route("/live/workers", workers_live),
        Route("/outbox/retry", outbox_action, methods=["POST"]),
        Route("/login", login, methods=["GET", "POST"]),
        Route(CALLBACK_PATH, oauth_callback),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(_CsrfSeed), Middleware(_Guard)]
    if config.app is not None:
        # Provider webhooks at /webhooks/, outside the console's guards (they are signed).
        from synckit.web.webhooks import WebhookRouter, webhook_app

        hooks = webhook_app(config.app, database=lambda: state.db)
        middleware.insert(0, Middleware(WebhookRouter, webhooks=hooks))
    starlette = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    starlette.state.console = state
    return starlette

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
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from synckit.clock import utcnow
from synckit.runtime.observe.alert_delivery import recent_alerts
from synckit.runtime.observe.budget import BudgetPolicy, BudgetStatus
from synckit.store import console, pages, queue_history
from synckit.store import workers as worker_store
from synckit.store.audit import Totals
from synckit.store.db import Database, open_database
from synckit.web import webhook_events
from synckit.web.security import (
    safe_next,
    token_valid,
)

if TYPE_CHECKING:
    pass
from synckit.web.base import (
    CALLBACK_PATH,
    HERE,
    JOB_STATUSES,
    TOKEN_COOKIE,
    ConsoleState,
    CsrfSeed,
    Guard,
    WebConfig,
    render,
    state_of,
    who_of,
)
from synckit.web.queue_pages import (
    dlq_action,
    dlq_export,
    dlq_page,
    dlq_row_page,
    job_page,
    jobs_action,
    jobs_page,
    outbox_action,
    outbox_page,
    workers_live,
    workers_page,
)
from synckit.web.tenant_pages import (
    oauth_callback,
    tenant_action,
    tenant_live,
    tenant_page,
    tenant_reauthorize,
    tenants_page,
)

__all__ = ["create_app"]

log = structlog.get_logger("synckit.web")


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


async def _firing(st: ConsoleState, now: datetime) -> tuple[list[Any], bool]:
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
    db = state_of(request).database
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
    firing, evaluated = await _firing(state_of(request), now)
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


# --- login ------------------------------------------------------------------------------


async def login(request: Request) -> Response:
    st = state_of(request)
    nxt = safe_next(request.query_params.get("next"))
    if request.method == "GET":
        return render(request, "login.html", next=nxt, failed=False)
    form = await request.form()
    given = form.get("token")
    nxt = safe_next(str(form.get("next") or "/"))
    if not st.config.token or not token_valid(
        st.config.token, given if isinstance(given, str) else None
    ):
        log.warning("web.login_failed", who=who_of(request))
        return render(request, "login.html", status_code=401, next=nxt, failed=True)
    response = RedirectResponse(nxt, status_code=303)
    response.set_cookie(
        TOKEN_COOKIE, str(given), httponly=True, samesite="strict", max_age=12 * 3600
    )
    log.info("web.login", who=who_of(request))
    return response


# --- assembly ---------------------------------------------------------------------------


def create_app(config: WebConfig, *, database: Database | None = None) -> Starlette:
    """The console as an ASGI application.

    The database is opened when the app starts (in the server's event loop) and
    disposed of when it stops; ``database`` gives one the caller owns instead.
    """
    state = ConsoleState(config)
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
    middleware = [Middleware(CsrfSeed), Middleware(Guard)]
    if config.app is not None:
        # Provider webhooks at /webhooks/, outside the console's guards (they are signed).
        from synckit.web.webhooks import WebhookRouter, webhook_app

        hooks = webhook_app(config.app, database=lambda: state.db)
        middleware.insert(0, Middleware(WebhookRouter, webhooks=hooks))
    starlette = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    starlette.state.console = state
    return starlette

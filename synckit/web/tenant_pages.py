"""The console's tenant pages: the tenants list, a tenant (its streams, checkpoints,
cycles and why the next one waits), its actions (pause, resume, sync now, reset the
breaker, remove) and re-authorisation through the provider's consent page and back
(``/oauth/callback``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from starlette.requests import Request
from starlette.responses import (
    PlainTextResponse,
    Response,
)

from synckit.clock import utcnow
from synckit.errors.exceptions import SynckitError, TenantNotFound
from synckit.printable import printable
from synckit.runtime.admin import tenants as tenant_store
from synckit.runtime.admin.audit import window_start
from synckit.runtime.observe.budget import BudgetPolicy
from synckit.runtime.sync.poll import POLL_KIND
from synckit.store import console
from synckit.store import workers as worker_store
from synckit.store.checkpoints import list_checkpoints
from synckit.store.jobs import admin as job_admin
from synckit.store.resources import get_resource, reset_resource
from synckit.web.explain import CycleFacts, duration_text, tenant_why

if TYPE_CHECKING:
    pass
from synckit.web.base import (
    CALLBACK_PATH,
    act,
    back,
    cursor_links,
    query_values,
    red,
    render,
    shown_config,
    state_of,
    who_of,
)

log = structlog.get_logger("synckit.web")


# --- tenants ----------------------------------------------------------------------------


async def tenants_page(request: Request) -> Response:
    db = state_of(request).database
    q = request.query_params
    status, connector, after, prefix = query_values(
        request, "status", "connector", "after", "prefix"
    )
    page = await console.tenant_page(
        db, status=status, connector=connector, after=after, prefix=prefix
    )
    total = await console.tenant_total(db, status=status, connector=connector, prefix=prefix)
    running = await job_admin.running_counts(db, [t.resource_key for t in page.rows])
    now = utcnow()
    rows = [
        (
            t,
            tenant_why(
                status=t.status,
                status_reason=red(t.status_reason) or None,
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
        **cursor_links(request, "after", page.next_cursor),
    )


async def _tenant_values(request: Request) -> dict[str, Any]:
    st = state_of(request)
    db = st.database
    name = request.path_params["tenant"]
    t = await tenant_store.get_tenant(db, name, reveal=False)
    now = utcnow()
    try:
        resource = await get_resource(db, t.resource_key)
    except LookupError:
        resource = None
    row = await console.tenant_row(db, t.tenant)
    running = (await job_admin.running_counts(db, [t.resource_key])).get(t.resource_key, 0)
    cycles = await job_admin.poll_jobs(db, t.resource_key, t.tenant, kind=POLL_KIND)
    why = tenant_why(
        cycle=cycle_facts(cycles[0], st.limit_of(POLL_KIND, cycles[0].max_attempts))
        if cycles
        else None,
        scheduled=await console.has_schedule(db, t.tenant),
        workers_alive=await worker_store.alive_count(db, now=now),
        status=t.status,
        status_reason=red(t.status_reason) or None,
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


def cycle_facts(job: job_admin.JobInfo, limit: int | None = None) -> CycleFacts:
    """A cycle job as :func:`~synckit.web.explain.tenant_why` reads it (error redacted);
    ``limit``: the attempts the worker gives it, when known beyond the row's."""
    return CycleFacts(
        id=job.id,
        status=job.status,
        run_at=job.run_at,
        attempts=job.attempts,
        max_attempts=job.max_attempts if limit is None else limit,
        last_error=red(job.last_error) or None,
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
    st = state_of(request)
    db = st.database
    name = request.path_params["tenant"]
    action = request.path_params["action"]
    home = f"/tenants/{name}"

    async def pause() -> str:
        t = await tenant_store.pause_tenant(db, name, f"paused in the console by {who_of(request)}")
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
    return await act(request, f"tenant.{action}", name, work, default=home)


async def tenant_reauthorize(request: Request) -> Response:
    """Start the connect flow ``synckit tenants connect`` runs: the connector's
    ``OAuth2Config``, a stored PKCE verifier and state, the provider's consent URL shown
    as a link. The provider sends the browser back to this console's
    :data:`CALLBACK_PATH`, which completes the flow. A connector without OAuth is told
    what to do instead (``synckit tenants set-config``)."""
    st = state_of(request)
    db = st.database
    name = request.path_params["tenant"]
    who = who_of(request)
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
        return back(request, form, f"re-authorise {name}: {text}", f"/tenants/{name}")
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
    st = state_of(request)
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
        result = await complete_authorization(
            db, tenant, config, str(request.url), network=st.config.app.network
        )
    except (SynckitError, LookupError, ValueError) as exc:
        text = red(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
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

"""The Graph mail application: the connector, and sending mail as a job.

``synckit worker --app synckit.examples.graph_mail.app:app`` runs it. Besides the poll cycles the
:class:`~synckit.App` schedules, it runs ``graph_mail.send`` jobs: :func:`enqueue_send`
writes one to the database, so a send survives restarts and retries, and the intent in
:meth:`GraphMail.send_mail` makes it happen once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from synckit import App, Tenant, get_tenant
from synckit.errors.exceptions import Discard, PermanentError, TenantNotFound
from synckit.examples.graph_mail.connector import GraphMail, GraphMailConfig, OutgoingMail
from synckit.runtime.credentials.oauth import reauth
from synckit.runtime.credentials.secrets import TokenSet
from synckit.runtime.jobs.handlers import JobContext
from synckit.store.db import Database
from synckit.store.jobs.enqueueing import Enqueued, enqueue

__all__ = ["SEND_KIND", "SendMailJob", "app", "connect_tenant", "enqueue_send", "make_app"]

SEND_KIND = "graph_mail.send"


class SendMailJob(BaseModel):
    """The payload of a ``graph_mail.send`` job."""

    tenant: str
    # Named so that synckit's audit counts attribute the job to the tenant's connector.
    connector: str = GraphMail.name
    key: str
    mail: OutgoingMail


def make_app(**options: Any) -> App:
    """An :class:`~synckit.App` with :class:`GraphMail` and the send job (options as for App)."""
    app = App([GraphMail], **options)

    async def send(jctx: JobContext) -> None:
        try:
            job = SendMailJob.model_validate(jctx.payload)
        except ValidationError as exc:
            raise PermanentError(f"malformed {SEND_KIND} payload: {exc}") from exc
        db = await app.database()
        try:
            tenant = await get_tenant(db, job.tenant)
        except TenantNotFound:
            raise Discard(f"tenant {job.tenant!r} was removed") from None
        async with app.context(db, tenant, trace_id=jctx.job.trace_id, log=jctx.log) as ctx:
            connector = ctx.connector
            if not isinstance(connector, GraphMail):
                raise Discard(f"tenant {job.tenant!r} is not a {GraphMail.name} tenant")
            result = await connector.send_mail(ctx, job.key, job.mail)
        jctx.log.info(
            "mail.sent", key=job.key, internet_message_id=result.remote_id, outcome=result.outcome
        )

    # Sends meet 429s and lost answers: give them room (each class keeps its own limit).
    app.registry.add(SEND_KIND, send, timeout=120.0, max_attempts=20)
    return app


app = make_app()


async def enqueue_send(
    db: Database, tenant: str, key: str, mail: OutgoingMail | Mapping[str, Any]
) -> Enqueued:
    """Enqueue the send named ``key`` (one job per key while it is unfinished).

    The job runs under the tenant's resource key, so its breaker, pacing and
    re-authorisation apply to it as to the tenant's poll cycles.
    """
    t = await get_tenant(db, tenant)
    payload = SendMailJob(tenant=tenant, key=key, mail=OutgoingMail.model_validate(mail))
    return await enqueue(
        db,
        SEND_KIND,
        payload.model_dump(mode="json"),
        resource_key=t.resource_key,
        unique_key=f"{SEND_KIND}:{tenant}:{key}",
    )


async def connect_tenant(
    app: App,
    db: Database,
    tenant: str,
    config: GraphMailConfig | Mapping[str, Any],
    token_response: Mapping[str, Any],
    *,
    schedule: str = "every 5m",
) -> Tenant:
    """Add a tenant and store the tokens its admin's consent produced.

    ``token_response`` is what the authorization-code exchange returned (access token,
    refresh token, ``expires_in``); from then on synckit refreshes them.
    """
    added = await app.add_tenant(db, tenant, GraphMail.name, config, schedule=schedule)
    await reauth(db, tenant, TokenSet.from_token_response(token_response, now=datetime.now(UTC)))
    return added

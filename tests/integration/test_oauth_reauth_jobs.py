"""A revoked refresh token stops that tenant's jobs, not others', and reauth resumes them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
import structlog
from cryptography.fernet import Fernet
from sqlalchemy import insert, select

from synckit.errors import RetryPolicy
from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config, reauth
from synckit.runtime.credentials.secrets import TokenSet
from synckit.runtime.http.transports import tls_context
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import connections, dead_letters, jobs
from synckit.testing.oauth_server import OAuthTestServer

TENANTS = {"acme": "alice", "globex": "bob"}


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", Fernet.generate_key().decode())


@pytest.fixture
def server() -> Iterator[OAuthTestServer]:
    with OAuthTestServer() as s:
        yield s


def registry_calling(db: Database, server: OAuthTestServer) -> Registry:
    reg = Registry()
    cfg = OAuth2Config(server.token_url, server.client_id, server.client_secret)

    @reg.handler("call_api")
    async def call_api(ctx: JobContext) -> None:
        auth = OAuth2Auth(db, ctx.payload["tenant"], cfg)
        async with httpx.AsyncClient(auth=auth, timeout=10, verify=tls_context()) as client:
            (await client.get(server.resource_url)).raise_for_status()

    return reg


async def job_rows(db: Database, tenant: str) -> list[tuple[str, int]]:
    async with db.begin() as conn:
        rows = await conn.execute(
            select(jobs.c.status, jobs.c.attempts)
            .where(jobs.c.resource_key == f"demo:{tenant}")
            .order_by(jobs.c.id)
        )
        return [(r.status, r.attempts) for r in rows]


async def test_revoked_refresh_token_parks_one_tenant_and_reauth_resumes_it(
    db: Database, server: OAuthTestServer
) -> None:
    """acme's refresh is refused: its jobs wait unspent; globex runs; reauth resumes acme."""
    now = datetime.now(UTC)
    issued: dict[str, dict[str, str]] = {}
    for tenant, user in TENANTS.items():
        issued[tenant] = server.issue_tokens(user, expires_in=0)  # every job must refresh
        async with db.begin() as conn:
            await conn.execute(
                insert(connections).values(
                    tenant=tenant,
                    connector="demo",
                    resource_key=f"demo:{tenant}",
                    created_at=now,
                    updated_at=now,
                )
            )
        await reauth(db, tenant, TokenSet.from_token_response(issued[tenant], now=now))
    server.revoke_refresh_token(issued["acme"]["refresh_token"])
    # One attempt each: a job that spent its attempt on the refusal would end dead.
    await enqueueing.enqueue_many(
        db,
        [
            JobSpec("call_api", {"tenant": t}, resource_key=f"demo:{t}", max_attempts=1)
            for t in TENANTS
            for _ in range(3)
        ],
    )
    worker = Worker(
        db,
        registry_calling(db, server),
        concurrency=4,
        poll_interval=0.05,
        retry_policy=RetryPolicy.deterministic(),
    )

    with structlog.testing.capture_logs() as logs:
        await worker.run_until_idle()

    assert await job_rows(db, "globex") == [("succeeded", 1)] * 3
    assert await job_rows(db, "acme") == [("pending", 0)] * 3  # waiting, attempts unspent
    async with db.begin() as conn:
        acme = (await conn.execute(select(connections).where(connections.c.tenant == "acme"))).one()
        assert (await conn.execute(select(dead_letters))).first() is None
        errors = [r.last_error or "" for r in await conn.execute(select(jobs.c.last_error))]
    assert acme.status == "needs_reauth" and "invalid_grant" in acme.status_reason
    alerts = [e for e in logs if e["event"] == "connection.needs_reauth"]
    assert len(alerts) == 1 and alerts[0]["tenant"] == "acme" and alerts[0]["alert"] is True
    # One refresh per tenant: acme's refused once (its other jobs were never claimed, or
    # saw the status), globex's shared by its three jobs.
    assert server.stats.invalid_grants == 1
    assert server.stats.token_requests_by_grant["refresh_token"] == 2

    # Parked jobs stay parked: another worker pass does nothing for acme.
    await worker.run_until_idle()
    assert await job_rows(db, "acme") == [("pending", 0)] * 3

    fresh = server.issue_tokens("alice")
    result = await reauth(db, "acme", TokenSet.from_token_response(fresh, now=datetime.now(UTC)))
    assert result.previous_status == "needs_reauth"
    await worker.run_until_idle()
    assert await job_rows(db, "acme") == [("succeeded", 1)] * 3

    # Nothing the runtime recorded about the failure holds a token.
    blob = "\n".join(errors + [repr(e) for e in logs])
    assert not [s for s in server.secrets_issued() if s in blob]

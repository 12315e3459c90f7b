"""The named operations of synckit.store.connections, on both engines: what the runtime's
tenants, token sets, leases, connect flow and bulk import rely on, asserted at the store."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from synckit.clock import utcnow
from synckit.errors.exceptions import ConnectionExists, ConnectionNotFound
from synckit.store import connections as store
from synckit.store.db import Database


async def _add(db: Database, tenant: str, *, schedule: str = "every 5m") -> None:
    async with db.begin() as conn:
        await store.insert_connection(
            conn,
            tenant=tenant,
            connector="items",
            resource_key=f"items:{tenant}",
            config={"k": 1},
            schedule=schedule,
            now=utcnow(),
        )


async def test_a_tenant_is_added_once_and_read_back(db: Database) -> None:
    """A second insert of the same tenant (a concurrent add that passed the check) is
    ConnectionExists, and nothing of it is kept."""
    await _add(db, "acme")
    with pytest.raises(ConnectionExists, match="'acme' exists already"):
        await _add(db, "acme", schedule="every 1h")
    async with db.begin() as conn:
        row = await store.read_tenant_row(conn, "acme")
        assert await store.connector_of(conn, "acme") == "items"
        assert await store.connector_of(conn, "nobody") is None
        assert await store.read_tenant_row(conn, "nobody") is None
    assert (row.tenant, row.schedule, row.status, json.loads(row.config_text)) == (
        "acme",
        "every 5m",
        "active",
        {"k": 1},
    )
    assert not row.has_tokens


async def test_status_config_and_counts(db: Database) -> None:
    for name in ("a", "b", "c"):
        await _add(db, name)
    now = utcnow()
    async with db.begin() as conn:
        await store.set_status(conn, "b", "paused", reason="x" * 900, now=now)
        await store.update_connection(conn, "c", now=now, config={"k": 2}, schedule="every 1h")
        await store.notify_workers(conn)
    async with db.begin() as conn:
        assert await store.count_tenants_by_status(conn, connector=None, status=None) == {
            "active": 2,
            "paused": 1,
        }
        assert await store.count_tenants_by_status(conn, connector="other", status=None) == {}
        paused = await store.read_tenant_row(conn, "b")
        assert len(paused.status_reason) == store.REASON_CHARS
        changed = await store.read_tenant_row(conn, "c")
        assert (json.loads(changed.config_text), changed.schedule) == ({"k": 2}, "every 1h")
        page = await store.tenant_page_rows(
            conn, limit=1, after="a", connector="items", status="active"
        )
        assert [r.tenant for r in page] == ["c"]
        assert [r.tenant for r in await store.tenant_rows(conn, status="paused")] == ["b"]
        await store.delete_connection(conn, "a")
    async with db.begin() as conn:
        assert await store.read_tenant_row(conn, "a") is None


async def test_the_refresh_lease_is_one_holders_at_a_time(db: Database) -> None:
    await _add(db, "acme")
    now = utcnow()
    later = now + timedelta(seconds=30)
    async with db.begin() as conn:
        await store.write_token_set(conn, "acme", sealed=b"one", expires_at=later, now=now)
        assert await store.take_refresh_lease(conn, "acme", owner="w1", until=later, now=now)
        assert not await store.take_refresh_lease(conn, "acme", owner="w2", until=later, now=now)
        # Not the holder: nothing stored.
        assert not await store.save_refreshed_token_set(
            conn, "acme", sealed=b"two", expires_at=later, owner="w2", now=now
        )
        assert await store.save_refreshed_token_set(
            conn, "acme", sealed=b"two", expires_at=later, owner="w1", now=now
        )
        row = await store.read_connection(conn, "acme", lock=True)
        assert (row.token_set, row.refresh_owner) == (b"two", None)
        # An expired lease is taken over.
        assert await store.take_refresh_lease(conn, "acme", owner="w1", until=now, now=now)
        assert await store.take_refresh_lease(conn, "acme", owner="w2", until=later, now=now)
        await store.mark_needs_reauth(conn, "acme", reason="refused", now=now)
        row = await store.read_connection(conn, "acme")
        assert (row.status, row.status_reason, row.refresh_owner) == (
            "needs_reauth",
            "refused",
            None,
        )
    async with db.begin() as conn:
        with pytest.raises(ConnectionNotFound):
            await store.write_token_set(conn, "nobody", sealed=b"x", expires_at=None, now=now)
        rows = await store.token_sets_page(conn, after="", limit=10)
        assert [(r.tenant, r.token_set) for r in rows] == [("acme", b"two")]


async def test_a_consent_state_is_claimed_once(db: Database) -> None:
    await _add(db, "acme")
    now = utcnow()
    async with db.begin() as conn:
        await store.add_pending_authorization(
            conn,
            state="s1",
            tenant="acme",
            sealed_verifier=b"v",
            redirect_uri="http://127.0.0.1/cb",
            expires_at=now + timedelta(minutes=10),
            now=now,
        )
    async with db.begin() as conn:
        assert (
            await store.claim_pending_authorization(conn, state="s1", tenant="other", now=now)
            is None
        )
        row = await store.claim_pending_authorization(conn, state="s1", tenant="acme", now=now)
        assert row is not None and row.verifier == b"v"
        assert (
            await store.claim_pending_authorization(conn, state="s1", tenant="acme", now=now)
            is None
        )
        seen = await store.read_pending_authorization(conn, "s1")
        assert seen is not None and seen.used_at is not None
        assert [r.state for r in await store.live_verifiers(conn, now=now)] == ["s1"]
        # Expired consents are deleted by the next read for rotation.
        assert await store.live_verifiers(conn, now=now + timedelta(hours=1)) == []


async def test_tenants_in_bulk(db: Database) -> None:
    await _add(db, "old")
    rows = [
        ("new1", "items", json.dumps({"k": 1}), "every 5m", "lane", "api:items", 2, 1.5, 3),
        ("new2", "items", json.dumps({"k": 2}), "every 5m", "lane", "api:items", 2, 1.5, 3),
        ("old", "items", json.dumps({}), "every 5m", "items:old", "api:items", None, None, None),
    ]
    async with db.begin() as conn:
        assert await store.existing_tenants(conn, ["old", "new1"]) == {"old"}
        created = await store.insert_connections(conn, rows, now=utcnow())
    assert created == {"new1", "new2"}
    async with db.begin() as conn:
        row = await store.read_tenant_row(conn, "new2")
        assert (row.resource_key, json.loads(row.config_text)) == ("lane", {"k": 2})
        assert await store.existing_tenants(conn, ["new1", "new2", "x"]) == {"new1", "new2"}

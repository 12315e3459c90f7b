"""The Graph mail example connector against the simulated Graph service on loopback.

Only synckit's public API, its testing kit and the example are used, as a connector
author's own tests would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.fernet import Fernet

from synckit import App, get_tenant, update_tenant
from synckit.errors.exceptions import NeedsReauth, PermanentError
from synckit.examples.graph_mail import (
    SEND_KIND,
    GraphMail,
    GraphSimulator,
    OutgoingMail,
    connect_tenant,
    enqueue_send,
    internet_message_id,
    make_app,
)
from synckit.store.db import Database
from synckit.store.dead_letters.reads import iter_rows
from synckit.store.dead_letters.rows import DlqFilter
from synckit.testing import PASS, Fault

if TYPE_CHECKING:
    from synckit.testing.fixtures import RunUntilIdle

pytest_plugins = ["synckit.testing.fixtures"]

TENANT = "contoso"
DELTA = "/v1.0/me/mailFolders/inbox/messages/delta"


@pytest.fixture
def sim() -> GraphSimulator:
    sim = GraphSimulator(seed=11, page_size=10)
    sim.add_mailbox(TENANT, messages=23, malformed=2)
    return sim


@pytest.fixture
async def base_url(sim: GraphSimulator) -> AsyncIterator[str]:
    async with sim.serve() as url:
        yield url


@pytest.fixture
async def app(synckit_db: Database, sim: GraphSimulator, base_url: str) -> App:
    app = make_app()
    await app.upgrade_records(synckit_db)  # what `synckit db upgrade --app` does
    config = {
        "tenant_id": TENANT,
        "client_id": sim.client_id,
        "client_secret": sim.client_secret,
        "graph_url": sim.graph_url(base_url),
        "token_url": sim.token_url(base_url, TENANT),
        "page_size": 10,
    }
    await connect_tenant(app, synckit_db, TENANT, config, sim.issue_tokens(TENANT))
    return app


@pytest.fixture(autouse=True)
def _token_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens are stored encrypted, as in production."""
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", Fernet.generate_key().decode())


async def stored_ids(db: Database) -> set[str]:
    """The messages landed and not deleted, as the app reads them."""
    rows = await make_app().records(TENANT, "messages", db=db).rows(limit=10_000)
    return {r["id"] for r in rows}


def inbox_ids(sim: GraphSimulator) -> set[str]:
    malformed = set(sim.mailbox(TENANT).malformed_ids)
    return {m["id"] for m in sim.messages(TENANT)} - malformed


def delta_calls(sim: GraphSimulator) -> list[dict[str, str]]:
    return [dict(r.query) for r in sim.api.calls("GET", DELTA)]


async def dead_letters(db: Database) -> list[Any]:
    return [row async for row in iter_rows(db, DlqFilter(tenants=(TENANT,)))]


# --- reading -------------------------------------------------------------------------------


async def test_delta_pages_are_followed_and_the_delta_link_is_the_next_cycle_s_start(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    first = await app.poll(synckit_db, TENANT)
    assert (first.pages, first.ok) == (3, 23)
    assert await stored_ids(synckit_db) == inbox_ids(sim)
    assert "deltaLink" in first.checkpoint

    new = sim.add_message(TENANT, subject="fresh")
    second = await app.poll(synckit_db, TENANT)
    assert (second.pages, second.ok, second.failed) == (1, 1, 0)
    assert "$deltatoken" in delta_calls(sim)[-1]
    assert new["id"] in await stored_ids(synckit_db)
    assert sim.stats.full_syncs[TENANT] == 1


async def test_a_cycle_cut_short_mid_sync_resumes_at_the_page_it_was_on(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    stored = await _one_page_then_fail(app, synckit_db, sim)
    assert 0 < stored < len(inbox_ids(sim))
    result = await app.poll(synckit_db, TENANT)
    first, failed, retried = delta_calls(sim)[:3]
    assert "$skiptoken" not in first and "$skiptoken" in failed
    assert retried == failed  # the next cycle starts at page two
    assert result.pages == 2 and sim.stats.full_syncs[TENANT] == 1
    assert await stored_ids(synckit_db) == inbox_ids(sim)


async def _one_page_then_fail(app: App, db: Database, sim: GraphSimulator) -> int:
    """Run a cycle whose second page request fails; return the rows stored."""
    sim.api.script("GET", DELTA, [PASS, Fault.server_error(500)])
    with pytest.raises(Exception, match="500"):
        await app.poll(db, TENANT)
    return len(await stored_ids(db))


async def test_an_expired_delta_token_is_answered_by_a_full_resync(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    await app.poll(synckit_db, TENANT)
    gone = sorted(inbox_ids(sim))[0]
    sim.delete_message(TENANT, gone)  # deleted while the token is dead: never reported
    added = sim.add_message(TENANT)
    sim.expire_delta_tokens(TENANT)

    result = await app.poll(synckit_db, TENANT)
    assert sim.stats.expired_delta_tokens[TENANT] == 1
    assert sim.stats.full_syncs[TENANT] == 2
    assert result.ok == 23  # 22 left + 1 added, all handled again
    stored = await stored_ids(synckit_db)
    assert added["id"] in stored and gone not in stored
    assert stored == inbox_ids(sim)


async def test_a_message_deleted_later_is_removed_by_the_delta(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    await app.poll(synckit_db, TENANT)
    gone = sorted(inbox_ids(sim))[0]
    sim.delete_message(TENANT, gone)
    await app.poll(synckit_db, TENANT)
    assert gone not in await stored_ids(synckit_db)


async def test_malformed_messages_fail_alone_and_wait_for_review_as_validation_errors(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    result = await app.poll(synckit_db, TENANT)
    assert (result.ok, result.failed) == (23, 2)
    rows = await dead_letters(synckit_db)
    assert {r.record_id for r in rows} == set(sim.mailbox(TENANT).malformed_ids)
    assert {(r.error_class, r.status, r.kind) for r in rows} == {
        ("validation", "review", "record:messages")
    }
    assert all(
        r.error_message.startswith("PermanentError: Message refused the record: receivedDateTime")
        for r in rows
    )


# --- auth ----------------------------------------------------------------------------------


async def test_expired_access_tokens_are_refreshed_and_each_rotated_refresh_token_kept(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    for round_ in (1, 2, 3):
        sim.expire_access_tokens(TENANT)
        sim.add_message(TENANT)
        result = await app.poll(synckit_db, TENANT)
        assert result.ok >= 1
        # A refresh token works once: the third refresh succeeds only if the token the
        # second returned was stored.
        assert sim.stats.token_refreshes[TENANT] == round_
    assert not sim.stats.token_errors


async def test_a_revoked_refresh_token_marks_the_tenant_needs_reauth(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    await app.poll(synckit_db, TENANT)
    sim.revoke(TENANT, access_tokens=True)
    with pytest.raises(NeedsReauth):
        await app.poll(synckit_db, TENANT)
    tenant = await get_tenant(synckit_db, TENANT)
    assert tenant.status == "needs_reauth"
    assert "invalid_grant" in (tenant.status_reason or "")
    assert sim.stats.token_errors[f"{TENANT}:invalid_grant"] == 1


async def test_the_worker_holds_a_revoked_tenant_s_send_without_spending_attempts(
    app: App, synckit_db: Database, sim: GraphSimulator, run_until_idle: RunUntilIdle
) -> None:
    sim.revoke(TENANT, access_tokens=True)
    await enqueue_send(synckit_db, TENANT, "held", _mail())
    stats = await run_until_idle(app)
    assert (stats.succeeded, stats.dead) == (0, 0)
    assert (await get_tenant(synckit_db, TENANT)).status == "needs_reauth"
    assert sim.stats.sends[TENANT] == 0


# --- writing -------------------------------------------------------------------------------


def _mail(n: int = 1) -> OutgoingMail:
    return OutgoingMail(to=["billing@customer.example"], subject=f"Invoice {n}", body="Due.")


async def test_a_send_whose_answer_is_lost_is_found_in_sent_items_not_sent_again(
    app: App, synckit_db: Database, sim: GraphSimulator, run_until_idle: RunUntilIdle
) -> None:
    sim.mailbox(TENANT).lost_send_rate = 1.0
    await enqueue_send(synckit_db, TENANT, "invoice-1", _mail())
    stats = await run_until_idle(app)
    assert (stats.succeeded, stats.retried, stats.dead) == (1, 1, 0)
    sent = sim.find_sent(TENANT, internet_message_id(TENANT, "invoice-1"))
    assert len(sent) == 1 and sent[0]["subject"] == "Invoice 1"
    assert (sim.stats.sends[TENANT], sim.stats.lost_sends[TENANT]) == (1, 1)


async def test_many_sends_with_lost_answers_each_land_exactly_once(
    app: App, synckit_db: Database, sim: GraphSimulator, run_until_idle: RunUntilIdle
) -> None:
    sim.mailbox(TENANT).lost_send_rate = 0.5
    keys = [f"invoice-{n}" for n in range(8)]
    for n, key in enumerate(keys):
        await enqueue_send(synckit_db, TENANT, key, _mail(n))
    stats = await run_until_idle(app)
    assert (stats.succeeded, stats.dead) == (8, 0)
    counts = [len(sim.find_sent(TENANT, internet_message_id(TENANT, k))) for k in keys]
    assert counts == [1] * 8
    assert sim.stats.lost_sends[TENANT] > 0
    assert sim.stats.sends[TENANT] == 8


async def test_the_same_send_twice_returns_the_stored_result_and_a_changed_one_is_refused(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    async with app.context(synckit_db, TENANT) as ctx:
        connector = ctx.connector
        assert isinstance(connector, GraphMail)
        first = await connector.send_mail(ctx, "welcome", _mail())
        again = await connector.send_mail(ctx, "welcome", _mail())
        with pytest.raises(PermanentError, match="different request"):
            await connector.send_mail(ctx, "welcome", _mail(2))
    assert (first.outcome, again.outcome) == ("created", "stored")
    assert first.remote_id == again.remote_id == internet_message_id(TENANT, "welcome")
    assert sim.stats.sends[TENANT] == 1


async def test_enqueueing_the_same_send_twice_makes_one_job(app: App, synckit_db: Database) -> None:
    one = await enqueue_send(synckit_db, TENANT, "k", _mail())
    two = await enqueue_send(synckit_db, TENANT, "k", _mail())
    assert one.id == two.id and not two.created


def test_the_app_is_importable_for_synckit_worker() -> None:
    from synckit.examples.graph_mail.app import app

    assert SEND_KIND in app.registry.kinds and "synckit.poll" in app.registry.kinds
    assert app.connector("graph_mail") is GraphMail


async def test_a_folder_that_does_not_exist_fails_the_cycle_without_looping(
    app: App, synckit_db: Database, sim: GraphSimulator
) -> None:
    tenant = await get_tenant(synckit_db, TENANT)
    await update_tenant(synckit_db, TENANT, config={**tenant.config, "folder": "nosuch"}, app=app)
    with pytest.raises(PermanentError, match="404"):
        await app.poll(synckit_db, TENANT)
    assert len(sim.api.calls("GET", "/v1.0/me/mailFolders/nosuch/messages/delta")) == 1

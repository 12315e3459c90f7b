"""The console over HTTP (Starlette's TestClient), on SQLite and PostgreSQL: pages, the
reasons a tenant waits, actions writing what the CLI writes, CSRF, token, read-only,
keyset pages, and no seeded secret on any page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_app import SECRET, app, seed

from synckit.connectors.tenants import get_tenant
from synckit.dlq import store as dlq_store
from synckit.runtime import jobs as job_store
from synckit.runtime.db import Database
from synckit.runtime.resources import get_resource
from synckit.web import WebConfig, create_app
from synckit.web.app import CSRF_COOKIE

TOKEN = "a-long-enough-access-token"


@contextmanager
def console(url: str, **options: Any) -> Iterator[TestClient]:
    config = WebConfig(database_url=url, app=app, **options)
    with TestClient(create_app(config), follow_redirects=False) as client:
        yield client


def csrf(client: TestClient) -> str:
    if not client.cookies.get(CSRF_COOKIE):
        client.get("/login")
    value = client.cookies.get(CSRF_COOKIE)
    assert value
    return value


def post(client: TestClient, path: str, **form: Any) -> Any:
    return client.post(path, data={"csrf": csrf(client), **form})


def text_of(html: str) -> str:
    """What a reader sees: tags dropped, whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


async def test_no_page_shows_a_seeded_secret(db: Database, migrated_url: str) -> None:
    """Configs (SecretStr fields), payloads, error texts, reasons, exports: all redacted."""
    seeded = await seed(db)
    with console(migrated_url) as client:
        paths = [
            "/",
            "/live/overview",
            "/tenants",
            "/jobs",
            "/dlq",
            "/dlq/export",
            "/outbox",
            *(f"/tenants/{t}" for t in ("acme", "globex", "initech", "umbrella")),
            *(f"/live/tenants/{t}" for t in ("acme", "umbrella")),
            *(f"/jobs/{i}" for i in seeded["jobs"]),
            *(f"/dlq/{i}" for i in seeded["dead_letters"]),
        ]
        for path in paths:
            r = client.get(path)
            assert r.status_code == 200, (path, r.text[:300])
            assert SECRET not in r.text, path
        # The secrets were there to leak: the pages show that something was hidden.
        assert "***" in client.get("/tenants/acme").text
        assert "order-1" in client.get("/dlq").text


async def test_a_tenant_page_says_why_it_waits(db: Database, migrated_url: str) -> None:
    """Paced until ... (Retry-After), paused with its reason, needs_reauth with its reason."""
    await seed(db)
    with console(migrated_url) as client:
        listing = text_of(client.get("/tenants").text)
        assert re.search(r"paced until \S+ \S+ UTC \(in 9m \d\ds\) \(Retry-After\)", listing)
        assert "paused: paused for the migration" in listing
        assert "needs re-authorisation: invalid_grant: refresh token revoked" in listing
        globex = text_of(client.get("/tenants/globex").text)
        assert "(Retry-After)" in globex and "paced until" in globex
        assert "nothing holds this tenant back" in text_of(client.get("/tenants/acme").text)


async def test_an_action_without_the_csrf_token_is_refused(db: Database, migrated_url: str) -> None:
    await seed(db)
    with console(migrated_url) as client:
        csrf(client)
        missing = client.post("/tenants/acme/pause", data={})
        wrong = client.post("/tenants/acme/pause", data={"csrf": "x" * 43})
        cross_site = client.post(
            "/tenants/acme/pause",
            data={"csrf": csrf(client)},
            headers={"Origin": "https://evil.example"},
        )
        assert [missing.status_code, wrong.status_code, cross_site.status_code] == [403] * 3
        assert "CSRF" in missing.text
        assert (await get_tenant(db, "acme")).status == "active"
        ok = post(client, "/tenants/acme/pause", next="/tenants/acme")
        assert ok.status_code == 303 and ok.headers["location"] == "/tenants/acme"
    t = await get_tenant(db, "acme")
    assert t.status == "paused" and "console" in (t.status_reason or "")


async def test_pause_resume_reset_and_sync_now_write_what_the_cli_writes(
    db: Database, migrated_url: str
) -> None:
    await seed(db)
    with console(migrated_url) as client:
        assert post(client, "/tenants/initech/resume").status_code == 303
        assert (await get_tenant(db, "initech")).status == "active"
        assert post(client, "/tenants/globex/reset").status_code == 303
        r = await get_resource(db, "shop:globex")
        assert r.next_available_at is None and r.state == "closed"
        first = post(client, "/tenants/acme/sync", next="/tenants/acme")
        page = client.get(first.headers["location"]).text
        assert "cycle enqueued" in page
        post(client, "/tenants/acme/sync")
        assert "already queued" in client.get("/tenants/acme").text
        # A tenant needing re-authorisation is refused with the CLI's reason, not a 500.
        post(client, "/tenants/umbrella/resume")
        assert "needs re-authorisation" in client.get("/tenants/umbrella").text
    cycles = await job_store.list_jobs(db, kind="synckit.poll")
    assert [(c.unique_key, c.resource_key) for c in cycles] == [("poll:acme:default", "shop:acme")]
    assert (await get_tenant(db, "umbrella")).status == "needs_reauth"


async def test_jobs_filters_detail_and_bulk_actions(db: Database, migrated_url: str) -> None:
    seeded = await seed(db)
    ids = seeded["jobs"]
    with console(migrated_url) as client:
        listing = client.get("/jobs", params={"kind": "send.invoice", "tenant": "acme"}).text
        assert all(f'value="{i}"' in listing for i in ids)
        assert "no jobs match" in client.get("/jobs", params={"status": "dead"}).text
        r = client.post(
            "/jobs/action",
            data={"csrf": csrf(client), "action": "cancel", "ids": ids[:3]},
        )
        assert r.status_code == 303
        assert "cancel: 3 job(s) done" in client.get("/jobs").text
        post(client, "/jobs/action", action="priority", priority="7", ids=[ids[3]])
        post(client, "/jobs/action", action="reschedule", delay="2h", ids=[ids[4]])
        post(client, "/jobs/action", action="retry", ids=[ids[0]])
        detail = client.get(f"/jobs/{ids[0]}").text
        assert "Timeline" in detail and "send.invoice" in detail
    states = {i: await job_store.get_job(db, i) for i in ids}
    assert [states[i].status for i in ids] == [
        "pending",
        "cancelled",
        "cancelled",
        "pending",
        "pending",
    ]
    assert states[ids[3]].priority == 7
    assert (states[ids[4]].run_at - states[ids[3]].run_at).total_seconds() > 7000


async def test_a_dead_letter_group_is_replayed_resolved_or_ignored_at_once(
    db: Database, migrated_url: str
) -> None:
    await seed(db)
    with console(migrated_url) as client:
        groups = client.get("/dlq").text
        assert "server_error" in groups and "validation" in groups
        post(
            client, "/dlq/action", action="replay", group_tenant="acme", group_class="server_error"
        )
        post(
            client, "/dlq/action", action="ignore", group_tenant="globex", group_class="validation"
        )
    rows = [r async for r in dlq_store.iter_rows(db)]
    assert {(r.tenant, r.status) for r in rows} == {("acme", "resolved"), ("globex", "ignored")}
    assert len(rows) == 5


async def test_outbox_lists_by_topic_and_retries(db: Database, migrated_url: str) -> None:
    await seed(db)
    with console(migrated_url) as client:
        page = client.get("/outbox").text
        assert "orders.synced" in page
        r = post(client, "/outbox/retry", ids=["1"])
        assert r.status_code == 303
        assert "1 outbox message(s) back to pending" in client.get("/outbox").text


async def test_pages_are_keyset_pages(db: Database, migrated_url: str) -> None:
    """Each page holds 50 rows and links the next by the last id, never an offset."""
    await job_store.enqueue_many(db, [job_store.JobSpec("bulk", {"n": i}) for i in range(120)])
    with console(migrated_url) as client:
        seen: list[int] = []
        query = "kind=bulk"
        for _ in range(5):
            html = client.get(f"/jobs?{query}").text
            seen += [int(x) for x in re.findall(r'name="ids" value="(\d+)"', html)]
            m = re.search(r'href="\?([^"]+)" rel="next"', html)
            if m is None:
                break
            query = m.group(1).replace("&amp;", "&")
            assert "before=" in query and "offset" not in query
    assert len(seen) == 120 and seen == sorted(seen, reverse=True)


async def test_read_only_shows_but_refuses_every_action(db: Database, migrated_url: str) -> None:
    await seed(db)
    with console(migrated_url, read_only=True) as client:
        page = client.get("/tenants/acme").text
        assert "read-only" in page and "Sync now" not in page
        r = post(client, "/tenants/acme/pause")
        assert r.status_code == 403 and "read-only" in r.text
    assert (await get_tenant(db, "acme")).status == "active"


async def test_a_token_guards_every_page_and_action(db: Database, migrated_url: str) -> None:
    await seed(db)
    with console(migrated_url, token=TOKEN) as client:
        assert client.get("/").status_code == 303
        assert client.get("/live/overview", headers={"HX-Request": "true"}).status_code == 401
        assert client.get("/static/htmx.min.js").status_code == 200
        assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        bad = client.post("/login", data={"csrf": csrf(client), "token": "wrong", "next": "/"})
        assert bad.status_code == 401
        assert post(client, "/tenants/acme/pause").status_code == 401
        good = post(client, "/login", token=TOKEN, next="/tenants")
        assert good.status_code == 303 and good.headers["location"] == "/tenants"
        assert client.get("/tenants").status_code == 200
        assert post(client, "/tenants/acme/pause").status_code == 303
    assert (await get_tenant(db, "acme")).status == "paused"


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example", "\\\\x"])
async def test_an_action_never_redirects_off_site(
    db: Database, migrated_url: str, target: str
) -> None:
    await seed(db)
    with console(migrated_url) as client:
        r = post(client, "/tenants/acme/pause", next=target)
        assert r.status_code == 303 and r.headers["location"] == "/tenants/acme"


async def test_every_form_carries_the_csrf_token(db: Database, migrated_url: str) -> None:
    """The hidden field a page renders is the value its POST is checked against."""
    seeded = await seed(db)
    with console(migrated_url) as client:
        for path in ("/tenants/acme", "/jobs", f"/jobs/{seeded['jobs'][0]}", "/dlq", "/outbox"):
            html = client.get(path).text
            values = set(re.findall(r'name="csrf" value="([^"]*)"', html))
            assert values == {client.cookies.get(CSRF_COOKIE)}, path
        html = client.get("/tenants/acme").text
        token = re.search(r'name="csrf" value="([^"]+)"', html)
        assert token is not None
        r = client.post("/tenants/acme/pause", data={"csrf": token.group(1)})
        assert r.status_code == 303
    assert (await get_tenant(db, "acme")).status == "paused"


async def test_every_action_is_logged_with_who_what_and_outcome(
    db: Database, migrated_url: str
) -> None:
    from structlog.testing import capture_logs

    await seed(db)
    with console(migrated_url) as client, capture_logs() as logs:
        post(client, "/tenants/acme/pause")
        post(client, "/tenants/umbrella/resume")
        client.post("/tenants/acme/resume", data={})
    events = [(e["event"], e.get("action"), e.get("target")) for e in logs]
    assert events == [
        ("web.action", "tenant.pause", "acme"),
        ("web.action_failed", "tenant.resume", "umbrella"),
        ("web.action_refused", None, None),
    ]
    assert logs[0]["who"] == "local@testclient" and logs[0]["outcome"] == "acme paused"
    assert logs[2]["path"] == "/tenants/acme/resume"

"""The console over HTTP (Starlette's TestClient), on SQLite and PostgreSQL: pages, the
reasons a tenant waits, actions writing what the CLI writes, CSRF, token, read-only,
keyset pages, and no seeded secret on any page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from starlette.testclient import TestClient
from web_app import SECRET, app, seed

from synckit.runtime.admin.tenants import get_tenant
from synckit.store import console as console_store
from synckit.store import pages
from synckit.store.db import Database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters.rows import DlqFilter
from synckit.store.jobs import admin, enqueueing
from synckit.store.resources import get_resource
from synckit.web import WebConfig, create_app
from synckit.web.base import CSRF_COOKIE

TOKEN = "a-long-enough-access-token"

LOCAL = "http://127.0.0.1"  # the Host a loopback console answers to


@contextmanager
def console(url: str, **options: Any) -> Iterator[TestClient]:
    config = WebConfig(database_url=url, app=app, **options)
    with TestClient(create_app(config), base_url=LOCAL, follow_redirects=False) as client:
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
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


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
    """Paced until ... (Retry-After), paused with its reason, needs_reauth with its reason;
    a scheduled tenant with its cycle queued: nothing holds it back."""
    await seed(db)
    await app.schedule(db)
    with console(migrated_url) as client:
        listing = text_of(client.get("/tenants").text)
        assert re.search(r"paced until \S+ \S+ UTC \(in 9m \d\ds\) \(Retry-After\)", listing)
        assert "paused: paused for the migration" in listing
        assert "needs re-authorisation: invalid_grant: refresh token revoked" in listing
        globex = text_of(client.get("/tenants/globex").text)
        assert "(Retry-After)" in globex and "paced until" in globex
        acme = client.get("/tenants/acme").text.split('id="why">', 1)[1].split("</ul>", 1)[0]
        # Nothing the claim checks holds it; only that no worker runs here.
        assert text_of(acme) == "no worker alive: nothing claims its jobs", acme


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
    cycles = await admin.list_jobs(db, kind="synckit.poll")
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
    states = {i: await admin.get_job(db, i) for i in ids}
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
    rows = [r async for r in dlq_reads.iter_rows(db)]
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
    await enqueueing.enqueue_many(db, [enqueueing.JobSpec("bulk", {"n": i}) for i in range(120)])
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


# --- re-authorise: the connect flow from the console -------------------------------------


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """authlib's provider on loopback, a public client, and the OAuth app pointed at it."""
    from cryptography.fernet import Fernet

    from synckit.testing.oauth_server import OAuthTestServer

    monkeypatch.setenv("SYNCKIT_SECRET_KEY", Fernet.generate_key().decode())
    with OAuthTestServer() as server:
        server.add_client("console-client", "", auth_methods=["none"])
        server.consenting_user = "alice"
        monkeypatch.setenv("OAUTH_APP_TOKEN_URL", server.token_url)
        monkeypatch.setenv("OAUTH_APP_AUTHORIZE_URL", server.authorize_url)
        monkeypatch.setenv("OAUTH_APP_CLIENT_ID", "console-client")
        monkeypatch.setenv("OAUTH_APP_CLIENT_SECRET", "")
        yield server


def consent_link(html: str) -> str:
    found = re.search(r'<a href="([^"]+)" id="consent-link"', html)
    assert found is not None, text_of(html)[:500]
    return unescape(found.group(1))


async def test_reauthorise_runs_the_connect_flow_and_the_callback_completes_it(
    db: Database, migrated_url: str, provider: Any
) -> None:
    """Re-authorise shows the provider's consent URL as a link (PKCE, state, this
    console's callback); the provider's redirect to the callback stores sealed tokens
    and makes the connection active; the same callback again is refused."""
    import httpx
    from oauth_worker_app import app as oauth_app

    from synckit.clock import utcnow
    from synckit.runtime.credentials.secrets import TokenCipher
    from synckit.store.connections import mark_needs_reauth, read_connection

    await oauth_app.add_tenant(db, "acme", "me")
    async with db.begin() as conn:
        await mark_needs_reauth(conn, "acme", reason="invalid_grant: revoked", now=utcnow())
    config = WebConfig(database_url=migrated_url, app=oauth_app)
    base = "http://127.0.0.1:8080"
    with TestClient(create_app(config), base_url=base, follow_redirects=False) as client:
        page = post(client, "/tenants/acme/reauthorize")
        assert page.status_code == 200
        url = consent_link(page.text)
        query = dict(parse_qsl(urlsplit(url).query))
        assert url.startswith(provider.authorize_url)
        assert query["redirect_uri"] == f"{base}/oauth/callback"
        assert query["code_challenge_method"] == "S256" and query["client_id"] == "console-client"
        # The operator opens the link; the provider (scripted consent) redirects back.
        async with httpx.AsyncClient() as browser:
            back = (await browser.get(url)).headers["location"]
        assert back.startswith(f"{base}/oauth/callback?")
        done = client.get(back.removeprefix(base))
        assert done.status_code == 200, done.text
        assert "is connected" in text_of(done.text) and "it was needs_reauth" in text_of(done.text)
        again = client.get(back.removeprefix(base))
        assert again.status_code == 400 and "used already" in text_of(again.text)
        why = client.get("/tenants/acme").text.split('id="why"', 1)[1].split("</ul>", 1)[0]
        assert "re-authorisation" not in why, why
    async with db.begin() as conn:
        row = await read_connection(conn, "acme")
    assert row.status == "active" and row.status_reason is None
    tokens = TokenCipher.from_env().open(row.token_set)
    assert tokens.access_token and tokens.refresh_token
    assert provider.stats.codes_exchanged == 1


async def test_reauthorise_without_oauth_says_to_set_the_config(
    db: Database, migrated_url: str, provider: Any
) -> None:
    """A connector whose credentials are in its config: the way to re-authorise is named;
    without the App, the console says it needs --app. Nothing is stored either way."""
    await seed(db)
    with console(migrated_url) as client:
        r = post(client, "/tenants/umbrella/reauthorize")
        assert r.status_code == 303 and r.headers["location"] == "/tenants/umbrella"
        said = text_of(client.get("/tenants/umbrella").text)
        assert "does not authenticate with OAuth2Auth" in said
        assert "synckit tenants set-config" in said
    with TestClient(
        create_app(WebConfig(database_url=migrated_url)), base_url=LOCAL, follow_redirects=False
    ) as c:
        post(c, "/tenants/umbrella/reauthorize")
        assert "start the console with --app" in text_of(c.get("/tenants/umbrella").text)
    from sqlalchemy import func, select

    from synckit.store.tables import pending_authorizations

    async with db.begin() as conn:
        n = (await conn.execute(select(func.count()).select_from(pending_authorizations))).scalar()
    assert n == 0 and (await get_tenant(db, "umbrella")).status == "needs_reauth"


async def test_the_callback_needs_no_token_but_a_state_it_issued(
    db: Database, migrated_url: str
) -> None:
    """Behind a token, the provider's redirect still reaches the callback (it is
    authorised by its state); a state the console never issued is refused."""
    await seed(db)
    with console(migrated_url, token=TOKEN) as client:
        r = client.get("/oauth/callback", params={"state": "forged", "code": "x"})
        assert r.status_code == 400 and "state is unknown" in text_of(r.text)
        assert post(client, "/tenants/umbrella/reauthorize").status_code == 401


# --- reads that stay cheap on large tables ------------------------------------------------


async def _jobs_in_every_state(db: Database) -> list[Any]:
    """Jobs of three tenants and two kinds in every state (states set as rows: no storage
    operation finishes a job without running it), oldest first; returns them all."""
    from sqlalchemy import update

    from synckit.store.tables import jobs

    specs = [
        enqueueing.JobSpec(
            ("sync", "send")[i % 2], {"n": i}, resource_key=("a", "b", "c", None)[i % 4]
        )
        for i in range(96)
    ]
    await enqueueing.enqueue_many(db, specs)
    async with db.begin() as conn:
        for i, status in enumerate(admin.JOB_STATUSES):
            await conn.execute(
                update(jobs).where(jobs.c.id % 6 == i, jobs.c.id > 12).values(status=status)
            )
    return await admin.list_jobs(db, limit=1000)


@pytest.mark.parametrize(
    "flt",
    [
        {},
        {"resource_key": "a"},
        {"resource_key": "b", "status": "succeeded"},
        {"resource_key": "c", "kind": "send"},
        {"resource_key": "a", "kind": "sync", "status": "pending"},
        {"status": "dead"},
        {"status": "discarded", "kind": "sync"},
        {"kind": "send"},
        {"kind": "sync"},
        {"kind": "nothing"},
    ],
)
async def test_a_job_page_by_index_lists_every_match_newest_first(
    db: Database, flt: dict[str, str]
) -> None:
    """Whatever index (or merge of indexes) serves the filter, paging through it gives
    exactly the matching jobs, by id descending, with no gap or repeat at page ends."""
    every = await _jobs_in_every_state(db)
    expected = [
        j.id
        for j in sorted(every, key=lambda j: -j.id)
        if all(getattr(j, k) == v for k, v in flt.items())
    ]
    seen: list[int] = []
    cursor = None
    for _ in range(50):
        page = await admin.job_page(db, admin.JobFilter(**flt), before_id=cursor, limit=7)
        seen += [j.id for j in page.rows]
        if page.next_cursor is None:
            break
        cursor = int(page.next_cursor)
    assert seen == expected


async def test_a_time_filter_reads_a_window_and_says_what_it_searched(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index serves creation time: each page reads at most SCAN_WINDOW jobs and,
    when it ends before the page is full, names the ids searched; walking on finds
    every match."""
    from datetime import timedelta

    from synckit.clock import utcnow

    monkeypatch.setattr(pages, "SCAN_WINDOW", 10)
    every = await _jobs_in_every_state(db)
    flt = admin.JobFilter(status="dead", created_since=utcnow() - timedelta(hours=1))
    seen: list[int] = []
    searched: list[tuple[int, int]] = []
    cursor = None
    for _ in range(50):
        page = await admin.job_page(db, flt, before_id=cursor, limit=50)
        seen += [j.id for j in page.rows]
        if page.searched:
            searched.append(page.searched)
        if page.next_cursor is None:
            break
        cursor = int(page.next_cursor)
    assert seen == [j.id for j in sorted(every, key=lambda j: -j.id) if j.status == "dead"]
    top = max(j.id for j in every)
    assert searched[0] == (top - 9, top) and all(hi - lo == 9 for lo, hi in searched)


async def test_overview_counts_stop_at_the_cap_and_say_so(
    db: Database, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the cap a count is exact; at it, "n+" (on PostgreSQL with the planner's
    estimate once the table is analysed), and never a figure that was not read."""
    await enqueueing.enqueue_many(db, [enqueueing.JobSpec(k, {}) for k in ["x", "y", "z"] * 10])
    async with db.begin() as conn:
        counts = await console_store.job_counts(conn, cap=12)
        exact = await console_store.job_counts(conn, cap=30)
    assert counts["pending"] == pages.Count(12, True, None)
    assert counts["pending"].text == "12+" and counts["dead"].text == "0"
    assert exact["pending"] == pages.Count(30) and exact["pending"].text == "30"
    if db.is_postgres:
        async with db.autocommit() as conn:
            await conn.exec_driver_sql("ANALYZE jobs")
        async with db.begin() as conn:
            estimated = (await console_store.job_counts(conn, cap=12))["pending"]
        assert estimated.estimate == 30 and estimated.text == "12+ (~30 estimated)"
    monkeypatch.setattr(pages, "COUNT_CAP", 25)
    with console(migrated_url) as client:
        page = client.get("/").text
    assert re.search(r'id="queue-depth">25\+', page)
    assert "counts stop at 25 rows" in text_of(page)


async def test_overview_shows_burn_breakers_and_the_alerts_the_worker_recorded(
    db: Database, migrated_url: str
) -> None:
    from datetime import timedelta

    from audit_rows import record_audit  # tests/

    from synckit.clock import utcnow
    from synckit.runtime.observe.alert_delivery import record_alerts
    from synckit.runtime.observe.alert_rules import Alert

    await seed(db)
    now = utcnow()
    async with db.begin() as conn:
        await record_audit(conn, "globex", "shop", now, 90, {"server_error": 10})
        await record_audit(conn, "acme", "shop", now - timedelta(hours=3), 0, {"timeout": 5})
        await record_alerts(
            conn,
            [
                Alert("poll_lag", "tenant globex", "no poll for 45m", now, "w1", tenant="globex"),
                Alert("dlq_growth", "shop", "old news", now - timedelta(hours=2), "w0"),
            ],
            now=now,
        )
    with console(migrated_url) as client:
        page = client.get("/").text
    burning = text_of(page.split('id="burning"')[1].split("</table>")[0])
    assert "globex 2000% alert 10/100 failed" in burning and "acme" not in burning
    alerts = text_of(page.split('id="alerts"')[1].split("</table>")[0])
    assert "poll_lag" in alerts and "no poll for 45m" in alerts and "old news" not in alerts
    assert re.search(r'id="dlq-open">5<', page)


async def test_dead_letter_groups_come_a_page_of_tenants_at_a_time(
    db: Database, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups by tenant name, counted from their rows (with the last 24 hours'); the
    next page of groups by cursor; a filtered row list searches a window at a time."""
    from datetime import timedelta

    from synckit.clock import utcnow

    now = utcnow()
    async with db.begin() as conn:
        for t in range(30):
            await dlq_capture.capture_many(
                conn,
                [
                    dlq_capture.Failure(
                        tenant=f"t{t:02d}",
                        connector="shop",
                        kind="record:default",
                        record_id=f"r{t}-{i}",
                        payload={},
                        error_class=("timeout", "validation")[i % 2],
                        message="boom",
                    )
                    for i in range(t % 4 + 1)
                ],
                now=now - timedelta(days=2) if t % 3 == 0 else now,
            )
    open_ = DlqFilter(statuses=("pending", "review"))
    first = await dlq_reads.dlq_groups(db, open_, recent_since=now - timedelta(hours=24))
    assert [g.tenant for g in first.rows][:3] == ["t00", "t01", "t01"]
    assert first.next_cursor == "t24"
    second = await dlq_reads.dlq_groups(
        db, open_, after=first.next_cursor, recent_since=now - timedelta(hours=24)
    )
    assert {g.tenant for g in second.rows} == {f"t{t}" for t in range(25, 30)}
    assert second.next_cursor is None
    groups = {(g.tenant, g.error_class): (g.count, g.recent) for g in first.rows + second.rows}
    assert groups[("t03", "timeout")] == (2, 0) and groups[("t03", "validation")] == (2, 0)
    assert groups[("t02", "timeout")] == (2, 2) and groups[("t02", "validation")] == (1, 1)
    assert sum(n for n, _ in groups.values()) == sum(t % 4 + 1 for t in range(30))
    with console(migrated_url) as client:
        html = client.get("/dlq").text
        assert 'rel="next-groups"' in html and "groups_after=t24" in html
        assert "t29" in client.get("/dlq?groups_after=t24").text
        monkeypatch.setattr(pages, "SCAN_WINDOW", 10)
        seen: list[int] = []
        query = "class=timeout"
        for _ in range(20):
            html = client.get(f"/dlq?{query}").text
            seen += [int(x) for x in re.findall(r'name="ids" value="(\d+)"', html)]
            m = re.search(r'href="\?([^"]+)" rel="next"', html)
            if m is None:
                break
            query = m.group(1).replace("&amp;", "&")
        assert "Searched dead letters" in client.get("/dlq?class=timeout").text
    timeouts = [r.id async for r in dlq_reads.iter_rows(db) if r.error_class == "timeout"]
    assert seen == sorted(timeouts, reverse=True)


async def test_an_unreadable_filter_is_named_not_ignored(db: Database, migrated_url: str) -> None:
    """`within=soon` lists nothing and says why in one line (400), rather than listing
    everything as if no filter had been given."""
    await seed(db)
    with console(migrated_url) as client:
        for path in ("/jobs?since=soon", "/dlq?since=soon"):
            r = client.get(path)
            assert r.status_code == 400, path
            assert "within 'soon': cannot read duration 'soon'" in text_of(r.text), path
            assert 'name="ids" value=' not in r.text, path
        r = client.get("/dlq/export?since=soon")
        assert r.status_code == 400 and "cannot read duration" in r.text


async def test_hostile_urls_get_an_answer_never_a_500(db: Database, migrated_url: str) -> None:
    """Cursors and ids past the database's integers, a NUL in the path or the query, a
    tenant filter naming nobody, a priority past 32 bits: each a 4xx or an empty page
    with the problem named, on both engines (each was a 500: an overflow on SQLite, a
    NUL on PostgreSQL, whose text cannot hold one)."""
    seeded = await seed(db)
    huge = "9" * 40
    with console(migrated_url) as client:
        for path in ("/jobs", "/dlq", "/outbox"):
            r = client.get(path, params={"before": huge})
            assert r.status_code == 200, (path, r.text[:300])
        assert client.get(f"/jobs/{huge}").status_code == 404
        assert client.get(f"/dlq/{huge}").status_code == 404
        for url in ("/tenants/%00", "/tenants?after=%00", "/jobs?kind=a%00b", "/dlq?tenant=%00"):
            r = client.get(url)
            assert r.status_code == 400 and "NUL" in r.text, (url, r.status_code)
        nobody = client.get("/jobs", params={"tenant": "nobody"})
        assert nobody.status_code == 400 and "no tenant 'nobody'" in text_of(nobody.text)
        job = seeded["jobs"][0]
        before = (await admin.get_job(db, job)).priority
        r = post(client, "/jobs/action", action="priority", priority=str(2**40), ids=[job])
        assert r.status_code == 303
        assert "priority must be a whole number from" in unescape(
            client.get(r.headers["location"]).text
        )
        assert (await admin.get_job(db, job)).priority == before


async def test_stored_terminal_escapes_are_shown_escaped(db: Database, migrated_url: str) -> None:
    """A reason holding ESC ]0; or a bidi override is shown as ``\\x1b`` on the page (after
    HTML escaping), never passed on raw."""
    from synckit.runtime.admin.tenants import pause_tenant

    await seed(db)
    await pause_tenant(db, "initech", "moved \x1b]0;pwned\x07 \u202eevil <b>x</b>")
    with console(migrated_url) as client:
        for path in ("/tenants", "/tenants/initech"):
            html = client.get(path).text
            assert "\x1b" not in html and "\u202e" not in html and "\x07" not in html, path
            assert "moved \\x1b]0;pwned\\x07 \\u202eevil &lt;b&gt;x&lt;/b&gt;" in html, path


async def test_a_request_naming_another_host_is_refused(db: Database, migrated_url: str) -> None:
    """Issue 34: the DNS-rebinding shape (``Host: evil.example:8080`` with a matching
    Origin) gets 400 on a loopback console, for a page and for an action; with a token,
    --allowed-host names the public host."""
    await seed(db)
    with console(migrated_url) as client:
        token = csrf(client)
        evil = {"host": "evil.example:8080", "origin": "http://evil.example:8080"}
        page = client.get("/tenants/acme", headers=evil)
        assert page.status_code == 400 and "not a loopback name" in page.text
        action = client.post("/tenants/acme/pause", data={"csrf": token}, headers=evil)
        assert action.status_code == 400
        assert client.get("/tenants/acme", headers={"host": "localhost:8080"}).status_code == 200
    assert (await get_tenant(db, "acme", reveal=False)).status == "active"
    with console(migrated_url, token=TOKEN, allowed_hosts=("console.example.com",)) as client:
        auth = {"authorization": f"Bearer {TOKEN}"}
        ok = client.get("/", headers={**auth, "host": "console.example.com"})
        assert ok.status_code == 200
        assert client.get("/", headers={**auth, "host": "evil.example"}).status_code == 400


async def test_tenants_are_searched_by_name_prefix(db: Database, migrated_url: str) -> None:
    """Issue 34: "name starts with" on /tenants; exact (case and _ are literal)."""
    await seed(db)
    for name in ("ACME-eu", "acme-us", "acmeXx", "acme_x"):
        await app.add_tenant(db, name, "shop", {"api_key": "k" * 20})
    with console(migrated_url) as client:

        def listed(prefix: str) -> list[str]:
            html = client.get("/tenants", params={"prefix": prefix}).text
            table = html.split('id="tenants"', 1)[1].split("</table>", 1)[0]
            return re.findall(r'href="/tenants/([^"]+)"', table)

        assert listed("acme") == ["acme", "acme-us", "acmeXx", "acme_x"]
        assert listed("acme_") == ["acme_x"]  # not LIKE's any-one-character
        assert listed("acme%") == []
        assert listed("ACME") == ["ACME-eu"]
        assert listed("zzz") == []

"""`synckit web` driven in a real Chromium (Debian's, by its path; nothing downloaded).

One console process and one browser for the module, on a seeded SQLite database (the
storage paths run on both engines in tests/integration/test_web.py). Screenshots of each
page are taken on every run; with SYNCKIT_UPDATE_SCREENSHOTS=1 they replace docs/img/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_browser import ROOT, SYNCKIT, console, env, page_on, seeded_db, with_db  # tests/
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT
from web_app import SECRET  # tests/apps, on the path by console_browser

from synckit.errors import RetryPolicy
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store import migrate
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.jobs import enqueueing

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect


def _env() -> dict[str, str]:
    return env(WEB_APP_PAGE_PAUSE="0.7")


async def failed_job(db: Any) -> int:
    """A job that failed twice against an API that echoed the secret: its page shows each
    attempt's error and the traceback, redacted."""
    reg = Registry()

    @reg.handler("sync.orders")
    async def sync_orders(ctx: JobContext) -> None:
        raise RuntimeError(
            f"400 from https://api.example/v1/orders?api_key={SECRET}: "
            "field 'total' must be positive; field 'currency' is not ISO 4217"
        )

    made = await enqueueing.enqueue(db, "sync.orders", {"tenant": "acme"}, max_attempts=2)
    await Worker(
        db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05
    ).run_until_idle()
    return made.id


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("web")

    async def before(db: Any) -> dict[str, Any]:
        return {"failed_job": await failed_job(db)}  # before the seed: this worker runs only it

    url, seeded = seeded_db(tmp, before=before)
    with console(url, tmp, WEB_APP_PAGE_PAUSE="0.7") as base:
        yield {"url": url, "base": base, "seeded": seeded, "tmp": tmp}


@pytest.fixture
def page(browser: Any, site: dict[str, Any]) -> Iterator[Any]:
    with page_on(browser, site["base"]) as pg:
        yield pg


def shot(page: Any, site: dict[str, Any], name: str) -> None:
    path = site["tmp"] / f"web-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("SYNCKIT_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(path, ROOT / "docs" / "img" / path.name)


def test_every_page_renders_without_a_secret_and_is_photographed(
    page: Any, site: dict[str, Any]
) -> None:
    """Overview, tenants (a throttled one says paced until ... (Retry-After)), a tenant,
    jobs, a job, dead letters, a dead letter, the outbox: none holds the seeded secret."""
    job_id = site["seeded"]["failed_job"]
    letter = site["seeded"]["dead_letters"][0]
    pages = [
        ("overview", "/"),
        ("tenants", "/tenants"),
        ("tenant", "/tenants/globex"),
        ("jobs", "/jobs"),
        ("job", f"/jobs/{job_id}"),
        ("dead-letters", "/dlq"),
        ("dead-letter", f"/dlq/{letter}"),
        ("outbox", "/outbox"),
    ]
    for name, path in pages:
        response = page.goto(path)
        assert response is not None and response.status == 200, path
        assert SECRET not in page.content(), path
        if name == "job":
            page.click("summary:has-text('traceback')")  # open, for the screenshot too
            text = page.inner_text("body")
            assert "run 2 failed (attempt 2 of 2) · " in text
            assert "RuntimeError: 400 from https://api.example/v1/orders?api_key=***" in text
            assert "Traceback (most recent call last)" in text and "in sync_orders" in text
        if name == "tenants":
            text = page.inner_text("#tenants")
            assert re.search(r"paced until .+ UTC \(in \d+m \d\ds\) \(Retry-After\)", text)
            assert "needs re-authorisation: invalid_grant" in text
        shot(page, site, name)


def test_an_action_without_the_csrf_token_is_refused(page: Any, site: dict[str, Any]) -> None:
    page.goto("/tenants/acme")
    # The browser holds the console's cookies; the form's hidden token is left out.
    refused = page.request.post("/tenants/acme/pause", form={"next": "/"})
    assert refused.status == 403 and "CSRF" in refused.text()
    page.reload()
    assert "paused" not in page.inner_text("#why")


def test_sync_now_shows_the_cycle_progress_without_a_reload(
    page: Any, site: dict[str, Any]
) -> None:
    page.goto("/tenants/acme")
    page.click("button[value=sync]")
    page.wait_for_selector("text=cycle enqueued")
    assert page.inner_text("#cycles .cycle-state") == "pending"
    # Set in the page: a reload would drop it.
    page.evaluate("window.__sameDocument = true")
    log = site["tmp"] / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [*SYNCKIT, "worker", "--app", "web_app:app", "--database-url", site["url"], "--burst"],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        # Three pages, 0.7 s each: the live panel shows the cycle running, then done.
        state = page.locator("#cycles .cycle-state").first
        expect(state).to_have_text("running", timeout=EVENT_TIMEOUT * 1000)
        shot(page, site, "sync-now")
        expect(state).to_have_text("succeeded", timeout=EVENT_TIMEOUT * 1000)
    finally:
        worker.wait(PROCESS_TIMEOUT)
    assert worker.returncode == 0, log.read_text()[-2000:]
    assert page.evaluate("window.__sameDocument") is True
    assert '"page": 3' in page.inner_text("#checkpoints")


def test_replaying_a_dead_letter_group_resolves_its_rows(page: Any, site: dict[str, Any]) -> None:
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmation with the count
    page.goto("/dlq")
    page.click("button[data-group='acme/server_error']")
    page.wait_for_selector("text=replay of 3 dead letter(s): 3 replayed and resolved")

    async def statuses(db: Any) -> dict[str, str]:
        return {
            r.record_id: r.status
            async for r in dlq_reads.iter_rows(db, dlq_rows.DlqFilter(tenants=("acme",)))
            if r.kind == "record:default"
        }

    assert with_db(site["url"], statuses) == {f"order-{i}": "resolved" for i in range(3)}


def test_binding_beyond_loopback_without_a_token_refuses_to_start(
    site: dict[str, Any],
) -> None:
    out = subprocess.run(
        [*SYNCKIT, "web", "--host", "0.0.0.0", "--database-url", site["url"]],
        env={k: v for k, v in _env().items() if k != "SYNCKIT_WEB_TOKEN"},
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert out.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines: give an access token" in out.stderr


def test_reauthorise_without_oauth_says_to_set_the_config(page: Any, site: dict[str, Any]) -> None:
    page.goto("/tenants/umbrella")
    page.click("button[value=reauthorize]")
    flash = page.locator(".flash")
    expect(flash).to_contain_text("does not authenticate with OAuth2Auth")
    expect(flash).to_contain_text("synckit tenants set-config")


def test_reauthorise_follows_the_consent_link_back_to_an_active_connection(
    browser: Any, tmp_path: Path
) -> None:
    """An OAuth tenant that needs re-authorisation: Re-authorise shows the provider's
    consent page as a link; following it, the provider redirects to the console, which
    stores the tokens; the tenant's page then says nothing holds it back."""
    from synckit.clock import utcnow
    from synckit.store.connections import mark_needs_reauth
    from synckit.testing.oauth_server import OAuthTestServer

    url = f"sqlite:///{tmp_path / 'oauth.db'}"
    with OAuthTestServer() as provider:
        provider.add_client("console-client", "", auth_methods=["none"])
        provider.consenting_user = "alice"
        oauth_env = {
            "WEB_APP_PAGE_PAUSE": "0.7",
            "OAUTH_APP_TOKEN_URL": provider.token_url,
            "OAUTH_APP_AUTHORIZE_URL": provider.authorize_url,
            "OAUTH_APP_CLIENT_ID": "console-client",
            "OAUTH_APP_CLIENT_SECRET": "",
        }

        async def prepare(db: Any) -> None:
            from oauth_worker_app import app as oauth_app

            await migrate.upgrade(db)
            await oauth_app.add_tenant(db, "acme", "me")
            await oauth_app.schedule(db)  # its tick, and its first cycle queued
            async with db.begin() as conn:
                await mark_needs_reauth(conn, "acme", reason="invalid_grant: revoked", now=utcnow())

        with_db(url, prepare)
        with (
            console(url, tmp_path, app="oauth_worker_app:app", **oauth_env) as base,
            page_on(browser, base) as pg,
        ):
            pg.goto("/tenants/acme")
            assert "needs re-authorisation: invalid_grant" in pg.inner_text("#why")
            pg.click("button[value=reauthorize]")
            link = pg.locator("#consent-link")
            expect(link).to_have_attribute("href", re.compile(re.escape(provider.authorize_url)))
            shot(pg, {"tmp": tmp_path}, "reauthorise")
            link.click()
            expect(pg.locator("#connect-result")).to_contain_text("is connected")
            pg.click("text=Back to acme")
            # Nothing the claim checks holds it back; no worker runs in this test.
            expect(pg.locator("#why")).to_have_text("no worker alive: nothing claims its jobs")

    async def status(db: Any) -> str:
        from synckit.runtime.admin.tenants import get_tenant

        return (await get_tenant(db, "acme", reveal=False)).status

    assert with_db(url, status) == "active"
    assert provider.stats.codes_exchanged == 1

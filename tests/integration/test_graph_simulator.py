"""The simulated Microsoft Graph mail service: delta sync, sendMail, throttling, tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from synckit.errors import ErrorClass, classify
from synckit.examples.graph_mail.simulator import REQUIRED_FIELDS, GraphSimulator
from synckit.runtime.credentials.oauth import authlib_client
from synckit.testing import FakeClock

# authlib's httpx client as synckit imports it (without its warning about httpx2).
AsyncOAuth2Client, OAuthError = authlib_client()

GRAPH = "https://graph.microsoft.com"
DELTA = "/v1.0/me/mailFolders/inbox/messages/delta"
START = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def sim(clock: FakeClock) -> GraphSimulator:
    sim = GraphSimulator(seed=7, page_size=10, clock=clock)
    sim.add_mailbox("contoso", messages=23, malformed=2)
    sim.add_mailbox("fabrikam", messages=3)
    return sim


def bearer(tokens: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens['access_token']}"}


@pytest.fixture
async def graph(sim: GraphSimulator) -> AsyncIterator[httpx.AsyncClient]:
    """contoso's in-process Graph client."""
    headers = bearer(sim.issue_tokens("contoso"))
    async with httpx.AsyncClient(
        transport=sim.transport(), base_url=GRAPH, headers=headers
    ) as client:
        yield client


async def full_sync(client: httpx.AsyncClient, url: str = DELTA) -> tuple[list[Any], str, int]:
    """Follow nextLinks to the deltaLink: (records, deltaLink, pages)."""
    records: list[Any] = []
    pages = 0
    while True:
        body = (await client.get(url)).raise_for_status().json()
        pages += 1
        records += body["value"]
        if "@odata.deltaLink" in body:
            return records, body["@odata.deltaLink"], pages
        url = body["@odata.nextLink"]


# --- delta sync ----------------------------------------------------------------------------


async def test_delta_pages_with_absolute_next_links_end_in_a_delta_link(
    sim: GraphSimulator,
) -> None:
    headers = bearer(sim.issue_tokens("contoso"))
    async with sim.serve() as base_url, httpx.AsyncClient(base_url=base_url, headers=headers) as c:
        first = (await c.get(DELTA)).json()
        assert len(first["value"]) == 10 and "@odata.deltaLink" not in first
        assert first["@odata.nextLink"].startswith(f"{base_url}{DELTA}?$skiptoken=")
        records, delta_link, pages = await full_sync(c, first["@odata.nextLink"])
    records = first["value"] + records
    assert pages + 1 == 3
    assert delta_link.startswith(f"{base_url}{DELTA}?$deltatoken=")
    assert sorted(r["id"] for r in records) == sorted(m["id"] for m in sim.messages("contoso"))


async def test_the_client_s_max_page_size_preference_is_honoured(
    graph: httpx.AsyncClient,
) -> None:
    graph.headers["Prefer"] = "odata.maxpagesize=4"
    records, _, pages = await full_sync(graph)
    assert (len(records), pages) == (25, 7)


async def test_asking_for_the_same_page_twice_gives_the_same_page(
    graph: httpx.AsyncClient,
) -> None:
    first = (await graph.get(DELTA)).json()
    again = (await graph.get(first["@odata.nextLink"])).json()
    repeat = (await graph.get(first["@odata.nextLink"])).json()
    assert again == repeat


async def test_the_delta_link_returns_only_what_changed_since(
    sim: GraphSimulator, graph: httpx.AsyncClient
) -> None:
    records, delta_link, _ = await full_sync(graph)
    added = [sim.add_message("contoso", subject=f"new {i}") for i in range(2)]
    changed = sim.update_message("contoso", records[0]["id"], isRead=True)
    sim.delete_message("contoso", records[1]["id"])
    sim.add_message("fabrikam")  # another mailbox: not contoso's change

    changes, next_delta, _ = await full_sync(graph, delta_link)
    by_id = {r["id"]: r for r in changes}
    assert set(by_id) == {added[0]["id"], added[1]["id"], changed["id"], records[1]["id"]}
    assert by_id[changed["id"]]["isRead"] is True
    assert by_id[records[1]["id"]]["@removed"] == {"reason": "deleted"}
    assert next_delta != delta_link
    nothing, _, _ = await full_sync(graph, next_delta)
    assert nothing == []


async def test_an_expired_delta_token_is_410_sync_state_not_found(
    sim: GraphSimulator, graph: httpx.AsyncClient, clock: FakeClock
) -> None:
    _, delta_link, _ = await full_sync(graph)
    assert sim.expire_delta_tokens("contoso") == 1
    gone = await graph.get(delta_link)
    assert gone.status_code == 410
    assert gone.json()["error"]["code"] == "SyncStateNotFound"
    records, _, _ = await full_sync(graph)  # a full resync works
    assert len(records) == 25


async def test_delta_tokens_age_out_by_the_clock(clock: FakeClock) -> None:
    sim = GraphSimulator(
        clock=clock, delta_token_ttl=timedelta(days=7), access_token_lifetime=timedelta(days=30)
    )
    sim.add_mailbox("contoso", messages=2)
    async with httpx.AsyncClient(
        transport=sim.transport(), base_url=GRAPH, headers=bearer(sim.issue_tokens("contoso"))
    ) as c:
        _, delta_link, _ = await full_sync(c)
        clock.advance(timedelta(days=6))
        assert (await c.get(delta_link)).status_code == 200
        clock.advance(timedelta(days=2))
        assert (await c.get(delta_link)).status_code == 410


async def test_malformed_messages_are_in_the_folder_and_break_a_required_field(
    sim: GraphSimulator, graph: httpx.AsyncClient
) -> None:
    records, _, _ = await full_sync(graph)
    bad = [r for r in records if r["id"] in sim.mailbox("contoso").malformed_ids]
    assert len(bad) == 2

    def well_formed(m: dict[str, Any]) -> bool:
        try:
            datetime.fromisoformat(m["receivedDateTime"])
            return all(isinstance(m[k], str) for k in ("id", "subject", "internetMessageId")) and (
                isinstance(m["from"]["emailAddress"]["address"], str)
            )
        except (KeyError, TypeError, ValueError):
            return False

    assert set(REQUIRED_FIELDS) >= {"id", "subject", "receivedDateTime"}
    assert not any(well_formed(m) for m in bad)
    assert all(well_formed(m) for m in records if m not in bad)


async def test_each_token_sees_only_its_own_mailbox(sim: GraphSimulator) -> None:
    headers = bearer(sim.issue_tokens("fabrikam"))
    async with httpx.AsyncClient(transport=sim.transport(), base_url=GRAPH, headers=headers) as c:
        records, _, _ = await full_sync(c)
        me = (await c.get("/v1.0/me")).json()
    assert len(records) == 3 and me["mail"] == "user@fabrikam.example"


# --- sendMail ------------------------------------------------------------------------------


def mail(internet_message_id: str) -> dict[str, Any]:
    return {
        "message": {
            "subject": "Invoice 42",
            "body": {"contentType": "text", "content": "Please pay."},
            "toRecipients": [{"emailAddress": {"address": "billing@customer.example"}}],
            "internetMessageId": internet_message_id,
        },
        "saveToSentItems": True,
    }


async def test_send_mail_answers_202_without_a_body_and_is_found_by_internet_message_id(
    sim: GraphSimulator, graph: httpx.AsyncClient
) -> None:
    sent = await graph.post("/v1.0/me/sendMail", json=mail("<inv-42@synckit.example>"))
    assert (sent.status_code, sent.content) == (202, b"")
    found = await graph.get(
        "/v1.0/me/mailFolders/sentitems/messages",
        params={"$filter": "internetMessageId eq '<inv-42@synckit.example>'"},
    )
    [message] = found.json()["value"]
    assert message["subject"] == "Invoice 42" and message["parentFolderId"] == "sentitems"
    other = await graph.get(
        "/v1.0/me/mailFolders/sentitems/messages",
        params={"$filter": "internetMessageId eq '<other@synckit.example>'"},
    )
    assert other.json()["value"] == []


async def test_send_mail_is_not_idempotent(sim: GraphSimulator, graph: httpx.AsyncClient) -> None:
    for _ in range(2):
        assert (await graph.post("/v1.0/me/sendMail", json=mail("<twice@x>"))).status_code == 202
    assert len(sim.find_sent("contoso", "<twice@x>")) == 2


async def test_an_invalid_send_is_a_400_and_sends_nothing(
    sim: GraphSimulator, graph: httpx.AsyncClient
) -> None:
    bad = await graph.post("/v1.0/me/sendMail", json={"message": {"subject": "no recipients"}})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "ErrorInvalidRecipients"
    assert sim.sent_items("contoso") == []


async def test_a_lost_send_mail_response_still_sends_over_loopback(clock: FakeClock) -> None:
    sim = GraphSimulator(clock=clock)
    sim.add_mailbox("contoso", lost_send_rate=1.0)
    headers = bearer(sim.issue_tokens("contoso"))
    async with sim.serve() as base_url, httpx.AsyncClient(base_url=base_url, headers=headers) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post("/v1.0/me/sendMail", json=mail("<lost@x>"))
        found = await c.get(
            "/v1.0/me/messages", params={"$filter": "internetMessageId eq '<lost@x>'"}
        )
    assert len(found.json()["value"]) == 1
    assert sim.stats.lost_sends["contoso"] == 1


# --- throttling ----------------------------------------------------------------------------


async def _statuses(sim: GraphSimulator, tenant: str, n: int) -> list[int]:
    headers = bearer(sim.issue_tokens(tenant))
    async with httpx.AsyncClient(transport=sim.transport(), base_url=GRAPH, headers=headers) as c:
        return [(await c.get("/v1.0/me")).status_code for _ in range(n)]


async def test_a_hard_throttled_mailbox_gets_429s_with_retry_after_seconds(
    clock: FakeClock,
) -> None:
    sim = GraphSimulator(seed=1, clock=clock, retry_after=3)
    sim.add_mailbox("calm")
    sim.add_mailbox("hot", throttled_hard=True)
    assert set(await _statuses(sim, "calm", 100)) == {200}
    hot = await _statuses(sim, "hot", 100)
    assert 20 <= hot.count(429) <= 60 and hot.count(200) == 100 - hot.count(429)

    async with httpx.AsyncClient(
        transport=sim.transport(), base_url=GRAPH, headers=bearer(sim.issue_tokens("hot"))
    ) as c:
        while (response := await c.get("/v1.0/me")).status_code != 429:
            pass
    assert response.headers["retry-after"] == "3"
    verdict = classify(response, now=clock())
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert verdict.retry_after == timedelta(seconds=3)


async def test_throttling_and_503s_are_reproducible_with_the_seed(clock: FakeClock) -> None:
    runs = []
    for _ in range(2):
        sim = GraphSimulator(seed=5, clock=clock, throttle_rate=0.2, server_error_rate=0.1)
        sim.add_mailbox("contoso")
        runs.append(await _statuses(sim, "contoso", 60))
    assert runs[0] == runs[1] and {200, 429, 503} <= set(runs[0])


async def test_a_request_quota_per_window_answers_the_wait_until_it_frees(
    clock: FakeClock,
) -> None:
    sim = GraphSimulator(clock=clock)
    sim.add_mailbox("contoso", request_limit=3, window=timedelta(seconds=10))
    headers = bearer(sim.issue_tokens("contoso"))
    async with httpx.AsyncClient(transport=sim.transport(), base_url=GRAPH, headers=headers) as c:
        assert [(await c.get("/v1.0/me")).status_code for _ in range(3)] == [200] * 3
        clock.advance(4)
        refused = await c.get("/v1.0/me")
        assert refused.status_code == 429 and refused.headers["retry-after"] == "6"
        clock.advance(6)
        assert (await c.get("/v1.0/me")).status_code == 200


# --- tokens --------------------------------------------------------------------------------


def refresh_form(sim: GraphSimulator, refresh_token: str) -> dict[str, str]:
    return {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "client_id": sim.client_id,
        "client_secret": sim.client_secret,
        "scope": "https://graph.microsoft.com/.default offline_access",
    }


async def test_token_expiry_refresh_rotation_and_revoke(
    sim: GraphSimulator, clock: FakeClock
) -> None:
    tokens = sim.issue_tokens("contoso")
    token_path = "/contoso/oauth2/v2.0/token"
    async with httpx.AsyncClient(transport=sim.transport(), base_url=GRAPH) as c:
        assert (await c.get("/v1.0/me", headers=bearer(tokens))).status_code == 200
        clock.advance(timedelta(hours=1))
        expired = await c.get("/v1.0/me", headers=bearer(tokens))
        assert expired.status_code == 401
        assert expired.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
        assert expired.json()["error"]["code"] == "InvalidAuthenticationToken"

        refreshed = await c.post(token_path, data=refresh_form(sim, tokens["refresh_token"]))
        new = refreshed.json()
        assert refreshed.status_code == 200 and new["token_type"] == "Bearer"
        assert new["refresh_token"] != tokens["refresh_token"]  # rotated
        assert (await c.get("/v1.0/me", headers=bearer(new))).status_code == 200

        reused = await c.post(token_path, data=refresh_form(sim, tokens["refresh_token"]))
        assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"

        sim.revoke("contoso")
        revoked = await c.post(token_path, data=refresh_form(sim, new["refresh_token"]))
        assert revoked.status_code == 400
        assert revoked.json()["error"] == "invalid_grant"
        assert revoked.json()["error_description"].startswith("AADSTS50173")
        # An access token outlives the revocation until it expires, as in Azure AD.
        assert (await c.get("/v1.0/me", headers=bearer(new))).status_code == 200
    assert sim.stats.token_refreshes["contoso"] == 1


async def test_a_refresh_token_is_only_good_at_its_own_tenant(sim: GraphSimulator) -> None:
    tokens = sim.issue_tokens("contoso")
    async with httpx.AsyncClient(transport=sim.transport(), base_url=GRAPH) as c:
        wrong_tenant = await c.post(
            "/fabrikam/oauth2/v2.0/token", data=refresh_form(sim, tokens["refresh_token"])
        )
        bad_secret = await c.post(
            "/contoso/oauth2/v2.0/token",
            data={**refresh_form(sim, tokens["refresh_token"]), "client_secret": "nope"},
        )
        unknown = await c.post(
            "/nowhere/oauth2/v2.0/token", data=refresh_form(sim, tokens["refresh_token"])
        )
    assert wrong_tenant.json()["error"] == "invalid_grant"
    assert (bad_secret.status_code, bad_secret.json()["error"]) == (401, "invalid_client")
    assert unknown.json()["error"] == "invalid_request"
    assert unknown.json()["error_codes"] == [90002]


async def test_authlib_s_oauth_client_refreshes_against_the_loopback_endpoint(
    sim: GraphSimulator,
) -> None:
    tokens = sim.issue_tokens("contoso")
    async with sim.serve() as base_url:
        token_url = sim.token_url(base_url, "contoso")
        async with AsyncOAuth2Client(
            client_id=sim.client_id,
            client_secret=sim.client_secret,
            token_endpoint_auth_method="client_secret_basic",
        ) as oauth:
            fresh = await oauth.refresh_token(token_url, refresh_token=tokens["refresh_token"])
            sim.revoke("contoso")
            with pytest.raises(OAuthError) as refused:
                await oauth.refresh_token(token_url, refresh_token=fresh["refresh_token"])
        async with httpx.AsyncClient(base_url=base_url) as c:
            me = await c.get("/v1.0/me", headers=bearer(fresh))
    assert refused.value.error == "invalid_grant"
    assert me.json()["mail"] == "user@contoso.example"


# --- the command line ----------------------------------------------------------------------


def test_the_module_serves_on_loopback_and_prints_its_base_url() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "synckit.examples.graph_mail.simulator",
            "--port",
            "0",
            "--messages",
            "3",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        info = json.loads(proc.stdout.readline())
        assert base_url.startswith("http://127.0.0.1:")
        tokens = info["tenants"]["contoso"]
        assert tokens["token_url"] == f"{base_url}/contoso/oauth2/v2.0/token"
        with httpx.Client(base_url=info["graph_url"], headers=bearer(tokens)) as c:
            body = c.get("/me/mailFolders/inbox/messages/delta").json()
        assert len(body["value"]) == 5  # 3 messages and the 2 malformed ones by default
    finally:
        proc.terminate()
        proc.wait(10)


# --- change notifications --------------------------------------------------------------


def _echoing(echo: bool) -> Any:
    """A notification endpoint on loopback: echoes the validationToken (or not)."""
    from urllib.parse import parse_qs, urlsplit

    from loopback import LoopbackServer  # tests/

    def respond(request: Any) -> tuple[int, dict[str, str], bytes]:
        token = parse_qs(urlsplit(request.path).query).get("validationToken", [""])[0]
        body = token if echo else "something else"
        return 200, {"Content-Type": "text/plain"}, body.encode()

    return LoopbackServer(respond)


def _subscription(url: str, expires: datetime) -> dict[str, Any]:
    return {
        "changeType": "created,updated",
        "notificationUrl": url,
        "resource": "me/mailFolders('inbox')/messages",
        "expirationDateTime": expires.isoformat().replace("+00:00", "Z"),
        "clientState": "state-1",
    }


async def test_a_subscription_is_made_only_after_the_url_echoes_the_validation_token(
    sim: GraphSimulator, graph: httpx.AsyncClient, clock: FakeClock
) -> None:
    good, bad = _echoing(True), _echoing(False)
    try:
        refused = await graph.post(
            "/v1.0/subscriptions",
            json=_subscription(bad.url + "/hook", clock() + timedelta(days=1)),
        )
        assert refused.status_code == 400 and "validation" in refused.text
        assert sim.subscriptions("contoso") == []
        made = await graph.post(
            "/v1.0/subscriptions",
            json=_subscription(good.url + "/hook", clock() + timedelta(days=1)),
        )
        assert made.status_code == 201, made.text
        assert made.json()["clientState"] == "state-1"
        (call,) = [r for r in good.requests if "validationToken=" in r.path]
        assert call.method == "POST" and call.path.startswith("/hook?")
        sim.add_message("contoso")
        sim.add_message("fabrikam")  # another tenant's mailbox: no notification
        assert sim.queued_notifications() == 1
    finally:
        good.close()
        bad.close()


async def test_subscription_expiry_is_capped_and_a_forgotten_or_expired_one_is_404(
    sim: GraphSimulator, graph: httpx.AsyncClient, clock: FakeClock
) -> None:
    server = _echoing(True)
    try:
        url = server.url + "/hook"
        too_far = clock() + timedelta(minutes=4231)
        r = await graph.post("/v1.0/subscriptions", json=_subscription(url, too_far))
        assert r.status_code == 400 and "4230 minutes" in r.text
        made = (
            await graph.post(
                "/v1.0/subscriptions", json=_subscription(url, clock() + timedelta(hours=1))
            )
        ).json()
        later = {"expirationDateTime": (clock() + timedelta(hours=5)).isoformat()}
        renewed = await graph.patch(f"/v1.0/subscriptions/{made['id']}", json=later)
        assert renewed.status_code == 200
        assert renewed.json()["expirationDateTime"].startswith(
            (clock() + timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M")
        )
        clock.advance(timedelta(hours=6))
        graph.headers.update(bearer(sim.issue_tokens("contoso")))  # the old one expired too
        gone = await graph.patch(f"/v1.0/subscriptions/{made['id']}", json=later)
        assert gone.status_code == 404
        assert classify(gone, now=clock()).error_class is ErrorClass.NOT_FOUND
        again = (
            await graph.post(
                "/v1.0/subscriptions", json=_subscription(url, clock() + timedelta(hours=1))
            )
        ).json()
        sim.forget_subscription(again["id"])
        assert (await graph.delete(f"/v1.0/subscriptions/{again['id']}")).status_code == 404
    finally:
        server.close()

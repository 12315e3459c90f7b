"""Cassettes (synckit.testing.cassettes, VCR.py): a connector's traffic is recorded once
against a real server on loopback, with every secret scrubbed, and replayed with the
server gone."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs installed
from pydantic import BaseModel, SecretStr
from vcr.errors import CannotOverwriteExistingCassetteException

from synckit import App, BearerToken, Connector, Page, SyncContext
from synckit.store.db import Database
from synckit.testing import FakeAPI, RecordedRequest, Reply
from synckit.testing.cassettes import scrub_body, use_cassette
from synckit.testing.fixtures import migrated_sqlite

TOKEN = "tok-live-0123456789abcdef"
API_KEY = "key-9f8e7d6c5b4a"
SERVER_SECRET = "srv-refresh-7a6b5c4d3e"
SIGNATURE = "sig-4242424242"


class Config(BaseModel):
    api_token: SecretStr
    api_key: SecretStr


def connector_for(base_url: str) -> type[Connector[Config]]:
    class Tickets(Connector[Config]):
        name = "tickets"
        auth = BearerToken("api_token")

        async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
            key = self.config.api_key.get_secret_value()
            answer = await ctx.http.get("/tickets", params={"api_key": key, "page": "1"})
            body = answer.json()
            yield Page(body["tickets"], checkpoint=body["next"])

        async def handle(self, ctx: SyncContext, record: Any) -> None:
            await ctx.http.post("/exports", json={"ticket": record["id"], "signature": SIGNATURE})

    Tickets.base_url = base_url
    return Tickets


def tickets_api() -> FakeAPI:
    api = FakeAPI()

    def tickets(request: RecordedRequest) -> Reply:
        assert request.bearer_token == TOKEN and request.query["api_key"] == API_KEY
        body = {"tickets": [{"id": 1}, {"id": 2}], "next": "c2", "refresh_token": SERVER_SECRET}
        return Reply.json(body, headers={"Set-Cookie": f"session={SERVER_SECRET}; HttpOnly"})

    api.route("GET", "/tickets", tickets)
    api.route("POST", "/exports", lambda r: Reply.json({"exported": r.json()["ticket"]}, 201))
    return api


async def poll_once(db: Database, base_url: str, token: str, key: str) -> tuple[int, int, Any]:
    app = App([connector_for(base_url)])
    await app.add_tenant(db, "acme", "tickets", {"api_token": token, "api_key": key})
    result = await app.poll(db, "acme")
    return result.ok, result.failed, result.checkpoint


async def test_recorded_once_on_loopback_scrubbed_then_replayed_with_the_server_down(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "cassettes" / "tickets.yaml"
    api = tickets_api()
    with api.serve_in_thread() as url:
        async with migrated_sqlite(tmp_path / "record.db") as db:
            with use_cassette(cassette, secrets=[TOKEN, API_KEY]):
                recorded = await poll_once(db, url, TOKEN, API_KEY)
    assert recorded == (2, 0, "c2")
    assert len(api.requests) == 3

    stored = cassette.read_text()
    for secret in (TOKEN, API_KEY, SERVER_SECRET, SIGNATURE):
        assert secret not in stored
    get, post, _ = yaml.safe_load(stored)["interactions"]
    assert get["request"]["headers"]["authorization"] == ["***"]
    assert get["request"]["uri"].endswith("/tickets?api_key=***&page=1")
    assert get["response"]["headers"]["set-cookie"] == ["***"]
    assert json.loads(get["response"]["body"]["string"])["refresh_token"] == "***"
    assert json.loads(post["request"]["body"]) == {"ticket": 1, "signature": "***"}

    # The server is gone; another token and key, a fresh database: the cassette answers.
    async with migrated_sqlite(tmp_path / "replay.db") as db:
        with use_cassette(cassette, record_mode="none") as played:
            replayed = await poll_once(db, url, "another-token-value", "another-key-value")
    assert replayed == recorded
    assert played.play_count == 3 and played.all_played
    assert len(api.requests) == 3  # nothing reached the (stopped) fake


async def test_a_request_the_cassette_does_not_hold_fails_instead_of_reaching_the_network(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "tickets.yaml"
    api = tickets_api()
    with api.serve_in_thread() as url:
        async with migrated_sqlite(tmp_path / "record.db") as db:
            with use_cassette(cassette, secrets=[TOKEN, API_KEY]):
                await poll_once(db, url, TOKEN, API_KEY)
    api.route("GET", "/tickets", {"tickets": [], "next": None})
    with api.serve_in_thread() as other_url:  # another port: not in the cassette
        async with migrated_sqlite(tmp_path / "replay.db") as db:
            refused = pytest.raises(CannotOverwriteExistingCassetteException, match="port differs")
            with use_cassette(cassette), refused:
                await poll_once(db, other_url, TOKEN, API_KEY)
    assert len(api.requests) == 3


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (
            b'{"access_token": "abc123xyz", "n": 1}',
            "application/json",
            b'{"access_token": "***", "n": 1}',
        ),
        (
            b"client_secret=s3cr3tv4lue&grant_type=refresh_token&refresh_token=r1r2r3r4",
            "application/x-www-form-urlencoded",
            b"client_secret=***&grant_type=refresh_token&refresh_token=***",
        ),
        (b"Authorization: Bearer abcdefghijkl", "text/plain", b"Authorization: Bearer ***"),
        (b"plain words, a known-secret-value inside", "text/plain", b"plain words, a *** inside"),
        (b"\xff\xfe binary", "application/octet-stream", b"\xff\xfe binary"),
    ],
)
def test_bodies_are_scrubbed_by_their_type(body: bytes, content_type: str, expected: bytes) -> None:
    assert scrub_body(body, content_type, ["known-secret-value"]) == expected

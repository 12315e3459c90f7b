"""synckit.testing.FakeAPI on loopback: the same faults over real sockets and real httpx."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from synckit.errors import ErrorClass, classify
from synckit.testing import FakeAPI, FakeClock, Fault, Reply

START = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
# Long enough that reaching it means a bug, however loaded the machine: a connect, a
# write and a read at 0.3 s each failed CI runs under full load (a ConnectTimeout, then
# a WriteTimeout on a plain 503).
CLIENT_TIMEOUT = httpx.Timeout(30.0)
# For the requests whose answer is held back on purpose: a short read, so that the
# hold times out quickly. Connecting and writing keep the long budget.
SHORT_READ = httpx.Timeout(30.0, read=0.3)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def created() -> list[dict[str, object]]:
    """What the POST /items handler created (its side effects)."""
    return []


@pytest.fixture
def api(clock: FakeClock, created: list[dict[str, object]]) -> FakeAPI:
    api = FakeAPI(clock=clock)
    api.route("GET", "/items", {"items": [1, 2, 3]})

    def create(r: object) -> Reply:
        created.append({"n": len(created) + 1})
        return Reply.json({"id": len(created)}, 201)

    api.route("POST", "/items", create)
    return api


@pytest.fixture
async def http(api: FakeAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        api.serve() as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=CLIENT_TIMEOUT) as c,
    ):
        yield c


async def test_serves_real_http_on_a_free_loopback_port(
    api: FakeAPI, http: httpx.AsyncClient
) -> None:
    first = await http.get("/items", params={"cursor": "a b"})
    second = await http.post("/items", json={"name": "x"})
    assert str(http.base_url).startswith("http://127.0.0.1:")
    assert first.json() == {"items": [1, 2, 3]} and second.status_code == 201
    assert api.requests[0].query == {"cursor": "a b"}
    assert api.requests[1].json() == {"name": "x"}
    assert api.requests[1].headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("form", "header", "value"),
    [
        ("seconds", "retry-after", "7"),
        ("http-date", "retry-after", "Wed, 01 May 2024 12:00:07 GMT"),
        ("retry-after-ms", "retry-after-ms", "7000"),
        ("x-ms-retry-after-ms", "x-ms-retry-after-ms", "7000"),
    ],
)
async def test_retry_after_forms_over_the_wire(
    api: FakeAPI, http: httpx.AsyncClient, clock: FakeClock, form: str, header: str, value: str
) -> None:
    api.script("GET", "/items", [Fault.rate_limited(retry_after=7, form=form)])  # type: ignore[arg-type]
    response = await http.get("/items")
    assert response.status_code == 429 and response.headers[header] == value
    assert classify(response, now=clock()).retry_after == timedelta(seconds=7)


async def test_a_503_burst_then_recovery(api: FakeAPI, http: httpx.AsyncClient) -> None:
    api.script("GET", "/items", [Fault.unavailable(times=3, retry_after=1)])
    statuses = [(await http.get("/items")).status_code for _ in range(4)]
    assert statuses == [503, 503, 503, 200]


async def test_a_timeout_holds_the_answer_past_the_client_timeout(
    api: FakeAPI, http: httpx.AsyncClient
) -> None:
    api.script("GET", "/items", [Fault.timeout(delay=60)])
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await http.get("/items", timeout=SHORT_READ)
    assert time.monotonic() - started < 30  # the client's 0.3 s, not the held 60 s
    assert (await http.get("/items")).status_code == 200


async def test_a_connection_reset_is_a_read_error(
    api: FakeAPI, http: httpx.AsyncClient, clock: FakeClock, created: list[dict[str, object]]
) -> None:
    api.script("POST", "/items", [Fault.connection_reset()])
    with pytest.raises(httpx.ReadError) as caught:
        await http.post("/items", json={})
    assert created == []
    assert classify(None, caught.value, now=clock()).error_class is ErrorClass.TRANSIENT
    assert (await http.get("/items")).status_code == 200


async def test_a_disconnect_without_an_answer(api: FakeAPI, http: httpx.AsyncClient) -> None:
    api.script("GET", "/items", [Fault.disconnect()])
    with pytest.raises(httpx.RemoteProtocolError):
        await http.get("/items")
    assert (await http.get("/items")).status_code == 200


async def test_a_lost_create_response_still_creates(
    api: FakeAPI, http: httpx.AsyncClient, created: list[dict[str, object]]
) -> None:
    api.script("POST", "/items", [Fault.lost_response()])
    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/items", json={"name": "x"})
    assert len(created) == 1
    assert (await http.post("/items", json={"name": "x"})).json() == {"id": 2}


async def test_a_slow_lost_create_response_times_out_after_committing(
    api: FakeAPI, http: httpx.AsyncClient, created: list[dict[str, object]]
) -> None:
    api.script("POST", "/items", [Fault.lost_response(delay=5)])
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/items", json={}, timeout=SHORT_READ)
    assert len(created) == 1


async def test_malformed_and_truncated_json_bodies(api: FakeAPI, http: httpx.AsyncClient) -> None:
    api.script("GET", "/items", [Fault.malformed_json(), Fault.truncated_json()])
    malformed = await http.get("/items")
    truncated = await http.get("/items")
    assert malformed.headers["content-type"] == "application/json"
    full = json.dumps({"items": [1, 2, 3]}).encode()
    assert truncated.content == full[: len(full) // 2]
    for response in (malformed, truncated):
        with pytest.raises(json.JSONDecodeError):
            response.json()


async def test_an_expired_cursor_is_410_gone(api: FakeAPI, http: httpx.AsyncClient) -> None:
    api.expire_cursor("c-old")
    assert (await http.get("/items", params={"cursor": "c-old"})).status_code == 410
    assert (await http.get("/items", params={"cursor": "c-new"})).status_code == 200


async def test_an_expired_token_is_refused_with_a_bearer_challenge(
    api: FakeAPI, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    api.require_auth = True
    token = api.issue_token(expires_in=60)
    headers = {"Authorization": f"Bearer {token}"}
    assert (await http.get("/items", headers=headers)).status_code == 200
    clock.advance(60)
    refused = await http.get("/items", headers=headers)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith('Bearer error="invalid_token"')


async def test_leaving_serve_does_not_wait_for_held_connections(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.timeout(delay=60)])
    started = time.monotonic()
    async with api.serve() as base_url, httpx.AsyncClient(base_url=base_url) as c:
        pending = asyncio.create_task(c.get("/items"))
        await asyncio.sleep(0.2)
    with pytest.raises(httpx.TransportError):
        await pending
    assert time.monotonic() - started < 30  # not the held answer's 60 s


def test_serve_in_thread_answers_a_synchronous_client(
    api: FakeAPI, created: list[dict[str, object]]
) -> None:
    api.script("POST", "/items", [Fault.lost_response(), Fault.rate_limited(2)])
    with (
        api.serve_in_thread() as base_url,
        httpx.Client(base_url=base_url, timeout=CLIENT_TIMEOUT) as c,
    ):
        with pytest.raises(httpx.RemoteProtocolError):
            c.post("/items", json={})
        assert c.post("/items", json={}).status_code == 429
        assert c.post("/items", json={}).json() == {"id": 2}
    assert len(created) == 2


async def test_random_faults_over_loopback_match_in_process(clock: FakeClock) -> None:
    def make() -> FakeAPI:
        api = FakeAPI(clock=clock)
        api.route("GET", "/items", {"items": []})
        api.faults(rate_limit=0.2, server_error=0.2, seed=9)
        return api

    in_process, served = make(), make()
    async with httpx.AsyncClient(transport=in_process.transport(), base_url="http://x") as c:
        expected = [(await c.get("/items")).status_code for _ in range(40)]
    async with served.serve() as url, httpx.AsyncClient(base_url=url) as c:
        seen = [(await c.get("/items")).status_code for _ in range(40)]
    assert seen == expected and {429, 503, 200} <= set(seen)

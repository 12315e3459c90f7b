"""synckit.testing.FakeAPI in-process: routes, scripts, every fault form, random faults."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from synckit.errors import ErrorClass, classify
from synckit.testing import PASS, FakeAPI, FakeClock, Fault, Reply

BASE = "https://api.test"
START = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def client(api: FakeAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=api.transport(), base_url=BASE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def created() -> list[object]:
    """What the POST /items handler created (its side effects)."""
    return []


@pytest.fixture
def api(clock: FakeClock, created: list[object]) -> FakeAPI:
    api = FakeAPI(clock=clock)
    api.route("GET", "/items", {"items": [1, 2, 3]})
    api.route("GET", "/items/{item_id}", lambda r: {"id": r.params["item_id"]})

    def create(r: object) -> Reply:
        created.append(r)
        return Reply.json({"id": len(created)}, 201)

    api.route("POST", "/items", create)
    return api


# --- routing and recording -----------------------------------------------------------------


async def test_static_json_and_handler_routes_answer(api: FakeAPI) -> None:
    async with client(api) as c:
        assert (await c.get("/items")).json() == {"items": [1, 2, 3]}
        assert (await c.get("/items/a%20b")).json() == {"id": "a b"}
        response = await c.post("/items", json={"name": "x"})
    assert response.status_code == 201 and response.json() == {"id": 1}


async def test_unknown_path_is_404_and_wrong_method_is_405(api: FakeAPI) -> None:
    async with client(api) as c:
        assert (await c.get("/nothing")).status_code == 404
        wrong = await c.delete("/items")
    assert wrong.status_code == 405
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "POST"}


async def test_every_request_is_recorded_with_method_path_query_headers_body_time(
    api: FakeAPI, clock: FakeClock
) -> None:
    async with client(api) as c:
        await c.get("/items", params={"cursor": "c1", "limit": "5"}, headers={"X-Trace": "t"})
        clock.advance(timedelta(seconds=3))
        await c.post("/items", json={"name": "x"})
    first, second = api.requests
    assert (first.method, first.path, dict(first.query)) == (
        "GET",
        "/items",
        {"cursor": "c1", "limit": "5"},
    )
    assert first.headers["x-trace"] == "t" and first.time == START
    assert second.json() == {"name": "x"} and second.time == START + timedelta(seconds=3)
    assert [r.path for r in api.calls("POST", "/items")] == ["/items"]


async def test_a_failing_handler_answers_500_and_keeps_the_exception(api: FakeAPI) -> None:
    def broken(_: object) -> None:
        raise RuntimeError("bug in the test handler")

    api.route("GET", "/broken", broken)
    async with client(api) as c:
        assert (await c.get("/broken")).status_code == 500
    assert [str(e) for e in api.handler_errors] == ["bug in the test handler"]


def test_the_transport_also_serves_a_synchronous_client(api: FakeAPI) -> None:
    with httpx.Client(transport=api.transport(), base_url=BASE) as c:
        assert c.get("/items/7").json() == {"id": "7"}


async def test_mock_router_routes_httpx_through_the_fake(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.rate_limited(retry_after=3)])
    with api.mock_router(base_url=BASE):
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"{BASE}/items")).status_code == 429
            assert (await c.get(f"{BASE}/items")).json() == {"items": [1, 2, 3]}


# --- scripts ---------------------------------------------------------------------------------


async def test_script_steps_answer_in_order_then_fall_back_to_the_handler(api: FakeAPI) -> None:
    api.script(
        "GET",
        "/items",
        [Reply.json({"items": []}), Fault.rate_limited(retry_after=7), PASS, Reply.empty(204)],
    )
    async with client(api) as c:
        statuses = [(await c.get("/items")).status_code for _ in range(5)]
        last = await c.get("/items")
    assert statuses == [200, 429, 200, 204, 200]
    assert last.json() == {"items": [1, 2, 3]}


async def test_a_script_on_a_template_covers_every_matching_path(api: FakeAPI) -> None:
    api.script("GET", "/items/{item_id}", [Fault.server_error(500)])
    async with client(api) as c:
        assert (await c.get("/items/9")).status_code == 500
        assert (await c.get("/items/9")).status_code == 200
    assert api.pending_script_steps("GET", "/items/{item_id}") == 0


async def test_a_503_burst_answers_n_in_a_row(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.unavailable(times=3)])
    async with client(api) as c:
        statuses = [(await c.get("/items")).status_code for _ in range(4)]
    assert statuses == [503, 503, 503, 200]


# --- rate limits: every form the framework reads ------------------------------------------


@pytest.mark.parametrize(
    ("form", "header", "value"),
    [
        ("seconds", "retry-after", "7"),
        ("http-date", "retry-after", "Wed, 01 May 2024 12:00:07 GMT"),
        ("retry-after-ms", "retry-after-ms", "7000"),
        ("x-ms-retry-after-ms", "x-ms-retry-after-ms", "7000"),
    ],
)
async def test_rate_limited_states_the_wait_in_each_form(
    api: FakeAPI, clock: FakeClock, form: str, header: str, value: str
) -> None:
    api.script("GET", "/items", [Fault.rate_limited(retry_after=7, form=form)])  # type: ignore[arg-type]
    async with client(api) as c:
        response = await c.get("/items")
    assert response.status_code == 429
    assert response.headers[header] == value
    verdict = classify(response, now=clock())
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert verdict.retry_after == timedelta(seconds=7)


async def test_an_http_date_wait_rounds_up_to_a_whole_second(api: FakeAPI) -> None:
    api.clock = lambda: START + timedelta(milliseconds=300)
    api.script("GET", "/items", [Fault.rate_limited(retry_after=2, form="http-date")])
    async with client(api) as c:
        response = await c.get("/items")
    assert response.headers["retry-after"] == "Wed, 01 May 2024 12:00:03 GMT"


# --- faults that are not answers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault.timeout(), httpx.ReadTimeout),
        (Fault.disconnect(), httpx.RemoteProtocolError),
        (Fault.connection_reset(), httpx.ReadError),
        (Fault.connect_error(), httpx.ConnectError),
    ],
)
async def test_unanswered_faults_raise_what_httpx_raises_and_skip_the_handler(
    api: FakeAPI, clock: FakeClock, fault: Fault, error: type[Exception], created: list[object]
) -> None:
    api.script("POST", "/items", [fault])
    async with client(api) as c:
        with pytest.raises(error) as caught:
            await c.post("/items", json={})
    assert created == []
    assert len(api.requests) == 1
    assert classify(None, caught.value, now=clock()).error_class is ErrorClass.TRANSIENT


async def test_a_lost_response_commits_the_create_then_drops_the_answer(
    api: FakeAPI, created: list[object]
) -> None:
    api.script("POST", "/items", [Fault.lost_response()])
    async with client(api) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post("/items", json={"name": "x"})
        again = await c.post("/items", json={"name": "x"})
    assert len(created) == 2  # the lost create happened
    assert again.json() == {"id": 2}


async def test_a_delayed_lost_response_looks_like_a_timeout_in_process(
    api: FakeAPI, created: list[object]
) -> None:
    api.script("POST", "/items", [Fault.lost_response(delay=5)])
    async with client(api) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/items", json={})
    assert len(created) == 1


async def test_a_handler_can_lose_its_own_response(api: FakeAPI) -> None:
    sent: list[str] = []

    def send(r: object) -> Fault:
        sent.append("x")
        return Fault.lost_response()

    api.route("POST", "/send", send)
    async with client(api) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post("/send")
    assert sent == ["x"]


# --- bodies --------------------------------------------------------------------------------


async def test_malformed_json_has_a_json_content_type_and_does_not_parse(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.malformed_json()])
    async with client(api) as c:
        response = await c.get("/items")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        response.json()


async def test_truncated_json_is_the_first_half_of_the_real_answer(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.truncated_json()])
    async with client(api) as c:
        response = await c.get("/items")
    full = json.dumps({"items": [1, 2, 3]}).encode()
    assert response.content == full[: len(full) // 2]
    assert response.headers["content-length"] == str(len(full) // 2)
    with pytest.raises(json.JSONDecodeError):
        response.json()


async def test_an_expired_cursor_answers_410_only_for_that_cursor(api: FakeAPI) -> None:
    api.expire_cursor("old", param="cursor")
    async with client(api) as c:
        gone = await c.get("/items", params={"cursor": "old"})
        fine = await c.get("/items", params={"cursor": "new"})
        other_param = await c.get("/items", params={"page": "old"})
    assert gone.status_code == 410 and gone.json() == {"error": "cursor_expired"}
    assert fine.status_code == 200 and other_param.status_code == 200


async def test_gone_can_be_scripted_with_the_api_s_own_body(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.gone({"error": {"code": "SyncStateNotFound"}})])
    async with client(api) as c:
        response = await c.get("/items")
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "SyncStateNotFound"


# --- bearer tokens -------------------------------------------------------------------------


async def test_tokens_expire_by_the_fake_clock(api: FakeAPI, clock: FakeClock) -> None:
    api.require_auth = True
    token = api.issue_token(expires_in=timedelta(minutes=5), subject="alice")
    headers = {"Authorization": f"Bearer {token}"}
    async with client(api) as c:
        assert (await c.get("/items", headers=headers)).status_code == 200
        clock.advance(timedelta(minutes=5))
        expired = await c.get("/items", headers=headers)
    assert expired.status_code == 401
    assert expired.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    assert classify(expired, now=clock()).error_class is ErrorClass.AUTH
    info = api.token_info(token)
    assert info is not None and info.subject == "alice"


async def test_missing_unknown_revoked_and_expired_tokens_get_401(api: FakeAPI) -> None:
    api.require_auth = True
    revoked, expired = api.issue_token(), api.issue_token()
    api.revoke_token(revoked)
    api.expire_token(expired)
    async with client(api) as c:
        missing = await c.get("/items")
        answers = [
            await c.get("/items", headers={"Authorization": f"Bearer {t}"})
            for t in ("unknown", revoked, expired)
        ]
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert [r.status_code for r in answers] == [401, 401, 401]
    assert all('error="invalid_token"' in r.headers["www-authenticate"] for r in answers)


async def test_routes_can_opt_out_of_auth(api: FakeAPI) -> None:
    api.require_auth = True
    api.route("POST", "/token", {"access_token": "x"}, auth=False)
    async with client(api) as c:
        assert (await c.post("/token")).status_code == 200
        assert (await c.get("/items")).status_code == 401


async def test_token_expired_can_be_scripted_whatever_the_token(api: FakeAPI) -> None:
    api.script("GET", "/items", [Fault.token_expired()])
    async with client(api) as c:
        response = await c.get("/items", headers={"Authorization": "Bearer fine"})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


# --- random faults -------------------------------------------------------------------------


async def _statuses(api: FakeAPI, n: int) -> list[str]:
    out = []
    async with client(api) as c:
        for _ in range(n):
            try:
                out.append(str((await c.get("/items")).status_code))
            except httpx.TransportError as exc:
                out.append(type(exc).__name__)
    return out


async def test_random_faults_are_reproducible_with_a_seed(clock: FakeClock) -> None:
    runs = []
    for _ in range(2):
        api = FakeAPI(clock=clock)
        api.route("GET", "/items", {"items": []})
        api.faults(rate_limit=0.2, server_error=0.1, timeout=0.05, connection_reset=0.05, seed=42)
        runs.append(await _statuses(api, 200))
    assert runs[0] == runs[1]
    counts = {s: runs[0].count(s) for s in set(runs[0])}
    assert 20 <= counts["429"] <= 60 and 5 <= counts["503"] <= 40
    assert counts["ReadTimeout"] > 0 and counts["ReadError"] > 0 and counts["200"] > 80


async def test_a_random_server_error_opens_a_burst(api: FakeAPI) -> None:
    api.faults(server_error=0.05, burst=4, seed=3)
    statuses = await _statuses(api, 300)
    runs = "".join("E" if s == "503" else "." for s in statuses).split(".")
    assert {len(r) for r in runs if r} <= {4, 8, 12}  # bursts may touch, never shorter
    assert any(runs)


async def test_random_faults_can_be_limited_to_methods_and_paths(api: FakeAPI) -> None:
    api.faults(rate_limit=1.0, methods=["POST"], seed=1)
    async with client(api) as c:
        assert (await c.get("/items")).status_code == 200
        assert (await c.post("/items")).status_code == 429
    api.faults(rate_limit=1.0, paths=["/items/{item_id}"], seed=1)
    async with client(api) as c:
        assert (await c.get("/items")).status_code == 200
        assert (await c.get("/items/1")).status_code == 429
    api.faults()  # off
    async with client(api) as c:
        assert (await c.get("/items/1")).status_code == 200


def test_fault_rates_adding_up_to_more_than_one_are_refused(api: FakeAPI) -> None:
    with pytest.raises(ValueError, match="add up"):
        api.faults(rate_limit=0.6, server_error=0.6)


def test_a_script_step_of_the_wrong_type_is_refused(api: FakeAPI) -> None:
    with pytest.raises(TypeError, match="script step"):
        api.script("GET", "/items", [{"items": []}])  # type: ignore[list-item]


# --- route() checks what it is given when it is given -----------------------------------------


async def test_a_reply_or_a_fault_is_a_route_answer(api: FakeAPI) -> None:
    api.route("GET", "/created", Reply.json({"id": 9}, 201, {"Location": "/items/9"}))
    api.route("GET", "/down", Fault.unavailable(retry_after=4))
    async with client(api) as c:
        created = await c.get("/created")
        down = await c.get("/down")
    assert (created.status_code, created.json(), created.headers["location"]) == (
        201,
        {"id": 9},
        "/items/9",
    )
    assert (down.status_code, down.headers["retry-after"]) == (503, "4")


class _NotJSON:
    pass


async def _async_handler(_: object) -> dict[str, int]:
    return {}


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (Reply.json, "route GET /items: Reply.json is a factory; pass what it returns"),
        (Fault.gone, "route GET /items: Fault.gone is a factory"),
        (Reply, "route GET /items: Reply is a factory"),
        ({"when": datetime(2024, 1, 1)}, "route GET /items: answers JSON, and dict is not JSON"),
        ({1, 2}, "route GET /items: answers JSON, and set is not JSON-serialisable"),
        (_NotJSON(), "route GET /items: answers JSON, and _NotJSON is not JSON-serialisable"),
        (Reply(200, {"a": 1}), "route GET /items: Reply body must be bytes, not dict"),  # type: ignore[arg-type]
        (Reply(1000), "route GET /items: Reply status must be an int in 100-599, not 1000"),
        (Reply(200, b"", (("X", 1),)), "route GET /items: Reply headers must be"),  # type: ignore[arg-type]
        (_async_handler, "route GET /items: handlers are plain functions"),
    ],
)
def test_route_refuses_what_it_cannot_answer_with_at_once_naming_the_route(
    target: object, message: str
) -> None:
    api = FakeAPI()
    with pytest.raises((TypeError, ValueError)) as caught:
        api.route("get", "/items", target)
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text
    assert api.calls() == [] and api._routes == []


def test_route_refuses_a_bad_method_or_path() -> None:
    api = FakeAPI()
    with pytest.raises(ValueError, match=r"route GET\?X /items: 'GET\?X' is not an HTTP method"):
        api.route("GET?X", "/items", {})
    with pytest.raises(ValueError, match="route GET items: the path must start with '/'"):
        api.route("GET", "items", {})


async def test_a_handler_answer_that_cannot_be_sent_is_a_500_naming_the_route(api: FakeAPI) -> None:
    api.route("GET", "/odd", lambda r: {"at": datetime(2024, 1, 1)})
    async with client(api) as c:
        answer = await c.get("/odd")
    assert answer.status_code == 500
    assert [str(e) for e in api.handler_errors] == [
        "route GET /odd's handler: answers JSON, and dict is not JSON-serialisable "
        "(Object of type datetime is not JSON serializable)"
    ]

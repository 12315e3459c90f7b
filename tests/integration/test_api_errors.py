"""Error bodies kept: a failed ``ctx.http`` call carries the API's status, headers and a
bounded, redacted body excerpt, and the provider's own message reaches the dead letter
and the log, on both engines, against a real server on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from synckit import (
    ApiError,
    App,
    Connector,
    ErrorBody,
    ErrorClass,
    Page,
    PermanentError,
    SyncContext,
)
from synckit.store.db import Database
from synckit.testing import dead_letters
from tests.loopback import LoopbackServer, Request

STRIPE_KEY = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
DECLINED = {
    "error": {
        "type": "card_error",
        "code": "card_declined",
        "decline_code": "insufficient_funds",
        "message": "Your card has insufficient funds.",
        "request_log_url": "https://dashboard.example.com/logs/req_1?api_key=" + STRIPE_KEY,
    }
}
BAD_KEY = {
    "error": {
        "type": "invalid_request_error",
        "message": f"Invalid API key provided: {STRIPE_KEY}",
    }
}


def stripe_like(req: Request) -> tuple[int, dict[str, str], bytes]:
    """``POST /v1/invoices`` answers by customer: a decline, a bad key (echoed, as Stripe
    does), a missing object, a huge body, a binary one; ``GET`` lists the customers."""
    if req.method == "GET":
        body = {"data": [{"id": c} for c in ("declined", "badkey", "missing", "huge", "binary")]}
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()
    customer = req.path.rsplit("=", 1)[-1]
    headers = {"Content-Type": "application/json", "Request-Id": "req_1"}
    if customer == "declined":
        headers["Set-Cookie"] = f"session={STRIPE_KEY}"
        return 402, headers, json.dumps(DECLINED).encode()
    if customer == "badkey":
        return 400, headers, json.dumps(BAD_KEY).encode()
    if customer == "missing":
        missing = {"error": {"type": "invalid_request_error", "code": "resource_missing",
                             "message": "No such customer: 'missing'"}}  # fmt: skip
        return 400, headers, json.dumps(missing).encode()
    if customer == "huge":
        return 500, {"Content-Type": "text/html"}, b"<html>" + b"x" * 3_000_000
    return 422, {"Content-Type": "application/octet-stream"}, bytes(range(256)) * 64


class Payments(Connector):
    name = "payments"
    base_url = "http://placeholder"
    error_body = ErrorBody(
        message="error.message",
        code=("error.type", "error.code"),
        classes={"resource_missing": ErrorClass.NOT_FOUND},
    )
    seen: list[ApiError] = []

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        listing = await ctx.http.get("/v1/customers")
        yield Page(listing.json()["data"], checkpoint={"done": True})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        try:
            await ctx.http.post(f"/v1/invoices?customer={record['id']}", json={"amount": 100})
        except ApiError as exc:
            Payments.seen.append(exc)
            raise


@pytest.fixture
def api() -> Iterator[LoopbackServer]:
    server = LoopbackServer(stripe_like)
    try:
        yield server
    finally:
        server.close()


async def _poll(db: Database, api: LoopbackServer) -> dict[str, Any]:
    Payments.seen = []

    class Here(Payments):
        base_url = api.url

    app = App([Here])
    await app.add_tenant(db, "acme", "payments")
    with capture_logs() as logs:
        result = await app.poll(db, "acme")
    assert (result.ok, result.failed) == (0, 5)
    rows = {row.record_id: row for row in await dead_letters(db, tenant="acme")}
    assert set(rows) == {"declined", "badkey", "missing", "huge", "binary"}
    return {"rows": rows, "logs": logs}


async def test_a_402_with_a_json_error_body_puts_the_providers_message_in_the_dead_letter(
    db: Database, api: LoopbackServer
) -> None:
    """The dead letter and the record.failed log line read "HTTP 402 ... card_error/
    card_declined: Your card has insufficient funds."; the exception carries the response."""
    seen = await _poll(db, api)
    row = seen["rows"]["declined"]
    assert "HTTP 402 Payment Required: card_error/card_declined: " in row.error_message
    assert "Your card has insufficient funds." in row.error_message
    assert row.error_class == "validation"
    (logged,) = [
        e for e in seen["logs"] if e["event"] == "record.failed" and e["record_id"] == "declined"
    ]
    assert "card_error/card_declined: Your card has insufficient funds." in logged["error"]

    (exc,) = [e for e in Payments.seen if e.status_code == 402]
    assert isinstance(exc, PermanentError)  # what the runtime does with it, too
    assert exc.response.method == "POST" and exc.response.url.endswith("/v1/invoices")
    assert exc.response.headers["request-id"] == "req_1"
    assert exc.response.headers["set-cookie"] == "***"
    assert exc.response.json()["error"]["code"] == "card_declined"
    assert exc.response.json()["error"]["decline_code"] == "insufficient_funds"


async def test_secrets_in_an_error_body_are_redacted_everywhere(
    db: Database, api: LoopbackServer
) -> None:
    """A key the API echoes in its message or a URL never reaches the dead letter, the log
    or the exception's excerpt."""
    seen = await _poll(db, api)
    row = seen["rows"]["badkey"]
    assert "invalid_request_error: Invalid API key provided: ***" in row.error_message
    for r in seen["rows"].values():
        assert STRIPE_KEY not in r.error_message and STRIPE_KEY not in (r.traceback or "")
    assert not any(STRIPE_KEY in repr(e) for e in seen["logs"])
    for exc in Payments.seen:
        assert STRIPE_KEY not in exc.response.text
        assert STRIPE_KEY not in str(exc)
        assert STRIPE_KEY not in json.dumps(dict(exc.response.headers))


async def test_an_error_code_can_choose_the_class(db: Database, api: LoopbackServer) -> None:
    """ErrorBody(classes={"resource_missing": NOT_FOUND}) makes that 400 a not_found."""
    seen = await _poll(db, api)
    row = seen["rows"]["missing"]
    assert row.error_class == "not_found"
    assert "invalid_request_error/resource_missing: No such customer: 'missing'" in (
        row.error_message
    )


async def test_huge_and_binary_bodies_stay_bounded_and_never_raise(
    db: Database, api: LoopbackServer
) -> None:
    """A 3 MB HTML 500 and a binary 422 fail their records with the status alone; each
    excerpt is at most 2 KiB of printable text, marked truncated."""
    seen = await _poll(db, api)
    huge, binary = seen["rows"]["huge"], seen["rows"]["binary"]
    assert huge.error_class == "server_error" and "HTTP 500" in huge.error_message
    assert binary.error_class == "validation" and "HTTP 422" in binary.error_message
    assert len(huge.error_message) < 500 and len(binary.error_message) < 500
    for exc in Payments.seen:
        assert len(exc.response.text) <= 2048
    (big,) = [e for e in Payments.seen if e.status_code == 500]
    (raw,) = [e for e in Payments.seen if e.status_code == 422]
    assert big.response.truncated and raw.response.truncated
    assert "\x00" not in raw.response.text and "\x01" not in raw.response.text

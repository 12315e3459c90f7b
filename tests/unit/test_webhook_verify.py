"""The built-in webhook verifiers: pure functions over (headers, raw body, secret, now).

Vectors come from each scheme's own documentation: the Standard Webhooks reference
signature (cross-checked with the ``standardwebhooks`` package), Stripe's ``t.body``
recipe, GitHub's published test vector, Graph's notification shape.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest
import standardwebhooks

from synckit.connectors.webhooks import (
    GraphNotifications,
    StandardWebhooks,
    StripeSignature,
    TenantFromBody,
    Webhooks,
    sign_standard,
    sign_stripe,
    verify_github,
    verify_graph,
    verify_standard,
    verify_stripe,
)
from synckit.errors.exceptions import ConfigurationError
from synckit.runtime.sync.webhooks import trigger_at

# The Standard Webhooks reference vector (the spec's libraries' tests).
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TS = 1614265330
SW_BODY = b'{"test": 2432232314}'
SW_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def _at(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _sw(sig: str = SW_SIG, ts: int = SW_TS, msg_id: str = SW_ID) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": sig}


def test_standard_reference_vector_is_what_we_sign_and_what_the_package_signs() -> None:
    """Our signer, the spec's reference signature and the reference package agree."""
    assert sign_standard(SW_SECRET, SW_ID, SW_TS, SW_BODY) == SW_SIG
    ref = standardwebhooks.Webhook(SW_SECRET).sign(SW_ID, _at(SW_TS), SW_BODY.decode())
    assert ref == SW_SIG


def test_standard_valid_delivery_verifies() -> None:
    assert verify_standard(_sw(), SW_BODY, SW_SECRET, _at(SW_TS + 10)) is None


def test_standard_one_of_several_signatures_suffices() -> None:
    """A sender rolling its secret sends several; one match is enough."""
    sig = "v1,Zm9vYmFy " + SW_SIG + " v2,whatever"
    assert verify_standard(_sw(sig), SW_BODY, SW_SECRET, _at(SW_TS)) is None


def test_standard_tampered_body_is_refused() -> None:
    assert verify_standard(_sw(), b'{"test": 2432232315}', SW_SECRET, _at(SW_TS)) == (
        "no matching signature"
    )


def test_standard_tampered_id_is_refused() -> None:
    assert verify_standard(_sw(msg_id="msg_other"), SW_BODY, SW_SECRET, _at(SW_TS)) is not None


def test_standard_stale_or_future_timestamp_is_refused() -> None:
    assert "tolerance" in (verify_standard(_sw(), SW_BODY, SW_SECRET, _at(SW_TS + 301)) or "")
    assert "tolerance" in (verify_standard(_sw(), SW_BODY, SW_SECRET, _at(SW_TS - 301)) or "")


def test_standard_replay_with_a_new_timestamp_is_refused() -> None:
    """A captured delivery replayed with a fresh timestamp no longer matches its signature."""
    later = SW_TS + 3600
    assert verify_standard(_sw(ts=later), SW_BODY, SW_SECRET, _at(later)) == "no matching signature"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"webhook-id": SW_ID, "webhook-timestamp": str(SW_TS)},
        {"webhook-id": SW_ID, "webhook-signature": SW_SIG},
        {**_sw(), "webhook-timestamp": "soon"},
        {**_sw(), "webhook-signature": "v1,not base64!!"},
        {**_sw(), "webhook-signature": "garbage"},
    ],
)
def test_standard_unsigned_or_malformed_is_refused_with_a_reason(headers: dict[str, str]) -> None:
    reason = verify_standard(headers, SW_BODY, SW_SECRET, _at(SW_TS))
    assert isinstance(reason, str) and reason


def test_standard_non_utf8_body_is_verified_as_bytes() -> None:
    body = b"\xff\xfe not utf-8"
    sig = sign_standard(SW_SECRET, SW_ID, SW_TS, body)
    assert verify_standard(_sw(sig), body, SW_SECRET, _at(SW_TS)) is None


def test_standard_secret_that_is_not_base64_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="whsec_"):
        verify_standard(_sw(), SW_BODY, "whsec_***", _at(SW_TS))


# Stripe: "compute an HMAC with the SHA256 hash function, using the endpoint's signing
# secret as the key and the signed_payload string (t + '.' + body) as the message".
ST_SECRET = "whsec_test_secret"
ST_TS = 1492774577
ST_BODY = b'{"id": "evt_1", "object": "event", "type": "charge.succeeded"}'
ST_MAC = hmac.new(ST_SECRET.encode(), b"1492774577." + ST_BODY, hashlib.sha256).hexdigest()


def _st(header: str) -> dict[str, str]:
    return {"stripe-signature": header}


def test_stripe_signature_follows_the_documented_recipe() -> None:
    assert sign_stripe(ST_SECRET, ST_TS, ST_BODY) == f"t={ST_TS},v1={ST_MAC}"


def test_stripe_valid_delivery_verifies_with_extra_schemes_present() -> None:
    header = f"t={ST_TS},v1={ST_MAC},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816"
    assert verify_stripe(_st(header), ST_BODY, ST_SECRET, _at(ST_TS + 5)) is None


def test_stripe_tampered_body_is_refused() -> None:
    header = f"t={ST_TS},v1={ST_MAC}"
    assert verify_stripe(_st(header), ST_BODY + b" ", ST_SECRET, _at(ST_TS)) == (
        "no matching signature"
    )


def test_stripe_stale_delivery_is_refused_and_tolerance_is_declared() -> None:
    header = f"t={ST_TS},v1={ST_MAC}"
    assert verify_stripe(_st(header), ST_BODY, ST_SECRET, _at(ST_TS + 301)) is not None
    assert verify_stripe(_st(header), ST_BODY, ST_SECRET, _at(ST_TS + 301), tolerance=600) is None


def test_stripe_replay_with_a_new_timestamp_is_refused() -> None:
    header = f"t={ST_TS + 1000},v1={ST_MAC}"
    assert verify_stripe(_st(header), ST_BODY, ST_SECRET, _at(ST_TS + 1000)) == (
        "no matching signature"
    )


@pytest.mark.parametrize(
    "header", ["", f"v1={ST_MAC}", f"t={ST_TS}", f"t={ST_TS},t={ST_TS},v1={ST_MAC}", "x" * 5000]
)
def test_stripe_unsigned_or_malformed_is_refused(header: str) -> None:
    headers = _st(header) if header else {}
    assert verify_stripe(headers, ST_BODY, ST_SECRET, _at(ST_TS)) is not None


def test_stripe_wrong_secret_is_refused() -> None:
    header = f"t={ST_TS},v1={ST_MAC}"
    assert verify_stripe(_st(header), ST_BODY, "whsec_other", _at(ST_TS)) is not None


# GitHub's documented test vector ("Validating webhook deliveries").
GH_SECRET = "It's a Secret to Everybody"
GH_BODY = b"Hello, World!"
GH_SIG = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_documented_vector_verifies() -> None:
    assert verify_github({"x-hub-signature-256": GH_SIG}, GH_BODY, GH_SECRET) is None


def test_github_tampered_body_or_wrong_secret_is_refused() -> None:
    assert verify_github({"x-hub-signature-256": GH_SIG}, b"Hello, World?", GH_SECRET)
    assert verify_github({"x-hub-signature-256": GH_SIG}, GH_BODY, "another secret")


@pytest.mark.parametrize("header", [None, "sha1=abc", "sha256=", "sha256=" + "0" * 64])
def test_github_unsigned_or_malformed_is_refused(header: str | None) -> None:
    headers = {} if header is None else {"x-hub-signature-256": header}
    assert verify_github(headers, GH_BODY, GH_SECRET) is not None


# Graph change notifications: {"value": [{..., "clientState": "..."}]}.
def _graph(*states: object) -> bytes:
    items = []
    for i, s in enumerate(states):
        item = {"subscriptionId": "sub-1", "changeType": "created", "resource": f"m/{i}"}
        if s is not None:
            item["clientState"] = s
        items.append(item)
    return json.dumps({"value": items}).encode()


def test_graph_every_notification_must_carry_the_client_state() -> None:
    assert (
        verify_graph(_graph("secretClientValue", "secretClientValue"), "secretClientValue") is None
    )
    assert verify_graph(_graph("secretClientValue", "forged"), "secretClientValue") is not None
    assert verify_graph(_graph("secretClientValue", None), "secretClientValue") is not None


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"value": []}', b'{"value": [1]}'])
def test_graph_body_without_notifications_is_refused(body: bytes) -> None:
    assert verify_graph(body, "s") is not None


def test_graph_events_are_one_per_notification_with_stable_ids() -> None:
    g = GraphNotifications(secret_field="client_state")
    body = _graph("s", "s")
    first, second = g.events({}, body), g.events({}, body)
    assert len(first) == 2 and first == second and first[0][0] != first[1][0]


def test_stripe_event_id_is_the_body_id_and_standard_the_header() -> None:
    assert StripeSignature("s").events({}, ST_BODY)[0][0] == "evt_1"
    assert StandardWebhooks("s").events(_sw(), SW_BODY)[0][0] == SW_ID


def test_tenant_from_body_reads_a_dotted_field() -> None:
    pick = TenantFromBody("installation.id")
    assert pick.value(b'{"installation": {"id": 42}}') == "42"
    assert pick.value(b'{"installation": 42}') is None
    assert pick.value(b"nope") is None


def test_declaration_is_checked() -> None:
    with pytest.raises(ConfigurationError):
        Webhooks(verify="stripe")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        StripeSignature(secret_field="")
    with pytest.raises(ConfigurationError):
        Webhooks(verify=StripeSignature("s"), max_body=0)


def test_trigger_at_coalesces_into_one_cycle_per_window() -> None:
    from datetime import timedelta

    now, w = _at(1000), timedelta(seconds=5)
    assert trigger_at(None, w, now) == now
    assert trigger_at(now - timedelta(seconds=5), w, now) == now
    assert trigger_at(now - timedelta(seconds=2), w, now) == now + timedelta(seconds=3)


def test_base64_secret_without_padding_is_accepted() -> None:
    raw = base64.b64encode(b"k" * 10).decode().rstrip("=")
    sig = sign_standard("whsec_" + raw, "m", SW_TS, b"x")
    assert verify_standard(_sw(sig, msg_id="m"), b"x", "whsec_" + raw, _at(SW_TS)) is None

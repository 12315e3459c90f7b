"""Error bodies read (pure): ErrorBody's paths, the classify seam adding the provider's
words to the reason (redacted, bounded), a connector's describe_error, BodyRule's shape,
and ApiResponse excerpts that stay bounded whatever the body."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit import ApiError, Connector, ErrorBody, ErrorDescription, NeedsReauth, RateLimited
from synckit.errors import BodyRule, ClassifyRules, ErrorClass, classify
from synckit.errors.exceptions import PermanentError
from synckit.errors.raising import exception_for
from synckit.runtime.http.api_errors import api_response
from synckit.runtime.http.client import api_error

NOW = datetime(2026, 3, 1, tzinfo=UTC)
STRIPE = {
    "error": {
        "type": "card_error",
        "code": "card_declined",
        "message": "Your card has insufficient funds.",
    }
}


def response(status: int, body: bytes | object, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.Response(
        status, content=content, headers=headers, request=httpx.Request("POST", "https://x/v1")
    )


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (STRIPE, "card_error/card_declined: Your card has insufficient funds."),
        ({"error": {"code": "ErrorItemNotFound", "message": "gone"}}, "ErrorItemNotFound: gone"),
        ({"error": "invalid_grant", "error_description": "expired"}, "invalid_grant: expired"),
        ({"message": "Validation Failed", "code": 422}, "Validation Failed"),
        (
            [{"message": "Session expired", "errorCode": "INVALID_SESSION_ID"}],
            "INVALID_SESSION_ID: Session expired",
        ),
        ({"title": "Bad", "detail": "amount must be positive"}, "amount must be positive"),
        ("Service temporarily down", "Service temporarily down"),
    ],
)
def test_the_default_reads_the_common_shapes(body: object, text: str) -> None:
    """Stripe, Graph, OAuth, GitHub, Salesforce, problem details and short plain text."""
    described = ErrorBody().describe(422, body)
    assert described is not None and described.text() == text


@pytest.mark.parametrize("body", [{}, [], None, 3, {"error": {}}, "<html>down</html>", "x" * 400])
def test_bodies_that_say_nothing_are_not_described(body: object) -> None:
    """No message, no code, markup or long text: no description."""
    assert ErrorBody().describe(500, body) is None


def test_a_declared_code_chooses_the_class_and_unmapped_keep_the_status() -> None:
    """classes maps a code part or the joined code to a class."""
    spec = ErrorBody(message="error.message", code=("error.type", "error.code"),
                     classes={"resource_missing": ErrorClass.NOT_FOUND})  # fmt: skip
    missing = {"error": {"type": "invalid_request_error", "code": "resource_missing",
                         "message": "No such customer"}}  # fmt: skip
    assert classify(response(400, missing), now=NOW, describe=spec.describe).error_class is (
        ErrorClass.NOT_FOUND
    )
    declined = classify(response(402, STRIPE), now=NOW, describe=spec.describe)
    assert declined.error_class is ErrorClass.VALIDATION
    assert declined.reason == (
        "HTTP 402 Payment Required: card_error/card_declined: Your card has insufficient funds."
    )


def test_bad_paths_and_classes_are_refused_when_declared() -> None:
    """An empty path or a class that is not an ErrorClass fails at the declaration."""
    with pytest.raises(ValueError, match="paths"):
        ErrorBody(message="")
    with pytest.raises(ValueError, match="ErrorClass"):
        ErrorBody(classes={"x": "not_found"})  # type: ignore[dict-item]


def test_the_providers_words_are_redacted_and_bounded_in_the_reason() -> None:
    """A key echoed in the message is masked; a huge message is cut to one bounded line."""
    echoed = {"error": {"message": "Invalid API key: sk_live_4eC39HqLyjWDarjtT1zdp7dc"}}
    r = response(401, echoed)
    error = api_error(classify(r, now=NOW), r.request, r)
    assert "sk_live_" not in str(error) and "Invalid API key: ***" in str(error)
    long = {"error": {"message": "word\n" * 5000}}
    reason = classify(response(400, long), now=NOW).reason
    assert "\n" not in reason and len(reason) <= 400


def test_the_reason_phrase_is_not_repeated() -> None:
    """GitHub's {"message": "Not Found"} on a 404 adds nothing."""
    assert classify(response(404, {"message": "Not Found"}), now=NOW).reason == (
        "HTTP 404 Not Found"
    )


def test_a_connectors_describe_error_is_used_and_its_failures_ignored() -> None:
    """An override's description reaches the reason; one that raises counts as none."""

    class Custom(Connector):
        name = "custom"

        def describe_error(self, status: int, body: object) -> ErrorDescription | None:
            assert isinstance(body, dict)
            return ErrorDescription(message=body["why"], error_class=ErrorClass.CONFLICT)

    verdict = Custom("t").classify(response(400, {"why": "stale version"}), None, NOW)
    assert verdict.error_class is ErrorClass.CONFLICT
    assert verdict.reason.endswith(": stale version")
    broken = Custom("t").classify(response(400, {"other": 1}), None, NOW)
    assert broken.error_class is ErrorClass.VALIDATION and broken.reason == "HTTP 400 Bad Request"


def test_a_connectors_body_rule_wins_over_the_error_body() -> None:
    """Precedence: body_rules, then the description's class, then by_status."""
    rules = ClassifyRules(body_rules=[(lambda r: True, ErrorClass.TRANSIENT)])
    spec = ErrorBody(classes={"card_declined": ErrorClass.CONFLICT})
    verdict = classify(response(402, STRIPE), now=NOW, rules=rules, describe=spec.describe)
    assert verdict.error_class is ErrorClass.TRANSIENT
    assert "insufficient funds" in verdict.reason


def test_body_rules_are_named_pairs_with_their_own_docstring() -> None:
    """help(BodyRule) documents the shape; plain tuples are converted."""
    assert "matches" in (BodyRule.__doc__ or "") and "tuple" not in BodyRule.__name__
    rules = ClassifyRules(body_rules=[(lambda r: False, ErrorClass.NOT_FOUND)])
    (rule,) = rules.body_rules
    assert isinstance(rule, BodyRule) and rule.error_class is ErrorClass.NOT_FOUND


@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, RateLimited), (401, NeedsReauth), (402, PermanentError), (503, Exception)],
)
def test_every_exception_for_a_response_is_an_api_error_and_its_category(
    status: int, kind: type[Exception]
) -> None:
    """except ApiError catches them all; the runtime still sees its category."""
    r = response(status, STRIPE, **{"X-Api-Key": "abcdef123456", "Request-Id": "req_9"})
    error = exception_for(classify(r, now=NOW), api_response(r))
    assert isinstance(error, ApiError) and isinstance(error, kind)
    assert error.status_code == status
    assert error.response.headers["x-api-key"] == "***"
    assert error.response.headers["request-id"] == "req_9"
    assert error.response.json() == STRIPE
    assert not isinstance(exception_for(classify(r, now=NOW)), ApiError)


@given(st.binary(max_size=20_000))
def test_any_body_gives_a_bounded_printable_excerpt(body: bytes) -> None:
    """Whatever bytes come back, the excerpt is at most 2 KiB without control characters,
    and classifying the response never raises."""
    r = response(400, body)
    kept = api_response(r)
    assert len(kept.text) <= 2048
    assert not any(ord(ch) < 32 and ch not in "\t\n" for ch in kept.text)
    if len(body) <= 2048:
        assert not kept.truncated
    if len(body) > 8192:
        assert kept.truncated
    classify(r, now=NOW)

"""classify(): the default error table, vendor rate-limit quirks and connector overrides."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

import synckit.errors
import synckit.errors.exceptions
from synckit.errors import ClassifyRules, ErrorClass, classify
from synckit.errors.exceptions import NeedsReauth, PermanentError, RateLimited, RetryableError

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
REQUEST = httpx.Request("GET", "https://api.example.com/items")


def response(
    status: int,
    headers: dict[str, str] | None = None,
    *,
    content: bytes = b"",
    json_body: object = None,
) -> httpx.Response:
    if json_body is not None:
        content = json.dumps(json_body).encode()
    return httpx.Response(status, headers=headers, content=content, request=REQUEST)


# --- the default table -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class", "retryable"),
    [
        (400, ErrorClass.VALIDATION, False),
        (401, ErrorClass.AUTH, True),
        (403, ErrorClass.AUTHORIZATION, False),
        (404, ErrorClass.NOT_FOUND, False),
        (405, ErrorClass.VALIDATION, False),
        (407, ErrorClass.AUTHORIZATION, False),
        (408, ErrorClass.TRANSIENT, True),
        (409, ErrorClass.CONFLICT, True),
        (410, ErrorClass.NOT_FOUND, False),
        (412, ErrorClass.CONFLICT, True),
        (413, ErrorClass.VALIDATION, False),
        (418, ErrorClass.VALIDATION, False),
        (422, ErrorClass.VALIDATION, False),
        (423, ErrorClass.CONFLICT, True),
        (425, ErrorClass.TRANSIENT, True),
        (429, ErrorClass.RATE_LIMITED, True),
        (431, ErrorClass.VALIDATION, False),
        (499, ErrorClass.TRANSIENT, True),
        (500, ErrorClass.SERVER_ERROR, True),
        (501, ErrorClass.SERVER_ERROR, True),
        (502, ErrorClass.TRANSIENT, True),
        (503, ErrorClass.TRANSIENT, True),
        (504, ErrorClass.TRANSIENT, True),
        (507, ErrorClass.SERVER_ERROR, True),
        (522, ErrorClass.TRANSIENT, True),
        (524, ErrorClass.TRANSIENT, True),
        (599, ErrorClass.SERVER_ERROR, True),
        (304, ErrorClass.UNKNOWN, True),
        (101, ErrorClass.UNKNOWN, True),
        (200, ErrorClass.UNKNOWN, True),
        (999, ErrorClass.UNKNOWN, True),
        (-1, ErrorClass.UNKNOWN, True),
    ],
)
def test_default_status_table(status: int, error_class: ErrorClass, retryable: bool) -> None:
    """Each status maps to its documented default class and retryability."""
    verdict = classify(response(status), now=NOW)
    assert (verdict.error_class, verdict.retryable) == (error_class, retryable)


@pytest.mark.parametrize(
    ("error_class", "max_attempts", "surface", "counts"),
    [
        (ErrorClass.TRANSIENT, 8, False, True),
        (ErrorClass.RATE_LIMITED, 20, False, False),
        (ErrorClass.AUTH, 2, True, True),
        (ErrorClass.AUTHORIZATION, 1, True, False),
        (ErrorClass.NOT_FOUND, 1, False, False),
        (ErrorClass.CONFLICT, 3, False, False),
        (ErrorClass.VALIDATION, 1, True, False),
        (ErrorClass.SERVER_ERROR, 3, False, True),
        (ErrorClass.UNKNOWN, 3, True, True),
    ],
)
def test_class_defaults_attempts_surface_and_breaker(
    error_class: ErrorClass, max_attempts: int, surface: bool, counts: bool
) -> None:
    """Each class carries its attempt limit, surfacing and whether it counts for the breaker."""
    status = {
        ErrorClass.TRANSIENT: 502,
        ErrorClass.RATE_LIMITED: 429,
        ErrorClass.AUTH: 401,
        ErrorClass.AUTHORIZATION: 403,
        ErrorClass.NOT_FOUND: 404,
        ErrorClass.CONFLICT: 409,
        ErrorClass.VALIDATION: 422,
        ErrorClass.SERVER_ERROR: 500,
        ErrorClass.UNKNOWN: 302,
    }[error_class]
    verdict = classify(response(status), now=NOW)
    assert verdict.error_class is error_class
    assert verdict.max_attempts == max_attempts
    assert verdict.retryable is (max_attempts > 1)
    assert verdict.surface is surface
    assert verdict.counts_for_breaker is counts


def test_reason_is_the_status_line() -> None:
    """The reason names the status and its phrase."""
    assert classify(response(429), now=NOW).reason == "HTTP 429 Too Many Requests"


@pytest.mark.parametrize(
    ("exc", "error_class"),
    [
        (httpx.ConnectTimeout("t"), ErrorClass.TRANSIENT),
        (httpx.ReadTimeout("t"), ErrorClass.TRANSIENT),
        (httpx.PoolTimeout("t"), ErrorClass.TRANSIENT),
        (httpx.ConnectError("refused"), ErrorClass.TRANSIENT),
        (httpx.ReadError("reset"), ErrorClass.TRANSIENT),
        (httpx.WriteError("broken pipe"), ErrorClass.TRANSIENT),
        (httpx.RemoteProtocolError("peer closed"), ErrorClass.TRANSIENT),
        (httpx.ProxyError("proxy"), ErrorClass.TRANSIENT),
        (TimeoutError(), ErrorClass.TRANSIENT),
        (ConnectionResetError(), ErrorClass.TRANSIENT),
        (synckit.errors.exceptions.DatabaseUnavailable("down"), ErrorClass.TRANSIENT),
        (httpx.DecodingError("bad gzip"), ErrorClass.SERVER_ERROR),
        (json.JSONDecodeError("Expecting value", "<html>", 0), ErrorClass.SERVER_ERROR),
        (ValueError("bug"), ErrorClass.UNKNOWN),
        (KeyError("x"), ErrorClass.UNKNOWN),
        (httpx.TooManyRedirects("loop"), ErrorClass.UNKNOWN),
    ],
)
def test_exception_table(exc: BaseException, error_class: ErrorClass) -> None:
    """Exceptions without a response map to their documented class."""
    assert classify(exc=exc, now=NOW).error_class is error_class


def test_unknown_exceptions_are_retryable_but_limited() -> None:
    """An unrecognised exception retries a few times, and is surfaced."""
    verdict = classify(exc=RuntimeError("?"), now=NOW)
    assert verdict.retryable
    assert verdict.max_attempts == 3
    assert verdict.surface


def test_handler_rate_limited_keeps_its_retry_after() -> None:
    """RateLimited from a handler is rate_limited with the handler's wait."""
    verdict = classify(exc=RateLimited("slow down", retry_after=timedelta(seconds=42)), now=NOW)
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert verdict.retry_after == timedelta(seconds=42)


def test_handler_retryable_error_is_transient_with_its_wait() -> None:
    """RetryableError is transient, keeping a wait if the handler gave one."""
    verdict = classify(exc=RetryableError("flaky", retry_after=timedelta(seconds=3)), now=NOW)
    assert (verdict.error_class, verdict.retry_after) == (
        ErrorClass.TRANSIENT,
        timedelta(seconds=3),
    )


def test_handler_negative_retry_after_is_dropped() -> None:
    """A negative wait from a handler is not a wait."""
    verdict = classify(exc=RetryableError("x", retry_after=timedelta(seconds=-3)), now=NOW)
    assert verdict.retry_after is None


def test_handler_needs_reauth_is_auth_without_retry() -> None:
    """NeedsReauth is auth and never retried: a refresh is known not to help."""
    verdict = classify(exc=NeedsReauth("invalid_grant"), now=NOW)
    assert verdict.error_class is ErrorClass.AUTH
    assert not verdict.retryable
    assert verdict.surface


def test_handler_permanent_error_is_validation() -> None:
    """PermanentError is validation: never retried."""
    verdict = classify(exc=PermanentError("bad record"), now=NOW)
    assert (verdict.error_class, verdict.retryable) == (ErrorClass.VALIDATION, False)


def test_handler_outcome_beats_the_response() -> None:
    """A handler's explicit outcome wins over the default class of the response."""
    verdict = classify(response(500), PermanentError("no"), now=NOW)
    assert verdict.error_class is ErrorClass.VALIDATION


def test_http_status_error_is_classified_by_its_response() -> None:
    """raise_for_status()'s exception is classified from the response it carries."""
    resp = response(404)
    exc = httpx.HTTPStatusError("not found", request=REQUEST, response=resp)
    assert classify(exc=exc, now=NOW).error_class is ErrorClass.NOT_FOUND


def test_success_response_with_exception_is_classified_by_the_exception() -> None:
    """A 200 whose body failed to stream is judged by the read error."""
    verdict = classify(response(200), httpx.ReadError("reset"), now=NOW)
    assert verdict.error_class is ErrorClass.TRANSIENT


def test_error_response_wins_over_exception() -> None:
    """With both an error response and an exception, the response decides."""
    verdict = classify(response(429), ValueError("x"), now=NOW)
    assert verdict.error_class is ErrorClass.RATE_LIMITED


def test_nothing_to_classify_is_unknown() -> None:
    """No response and no exception gives unknown rather than raising."""
    assert classify(now=NOW).error_class is ErrorClass.UNKNOWN


# --- waits and rate limits -----------------------------------------------------------


def test_503_with_retry_after_is_rate_limited_with_the_wait() -> None:
    """A 503 carrying Retry-After is throttling: rate_limited, with the server's wait."""
    verdict = classify(response(503, {"Retry-After": "120"}), now=NOW)
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert verdict.retry_after == timedelta(minutes=2)


def test_503_with_garbage_retry_after_stays_transient() -> None:
    """An unreadable Retry-After is no wait: the 503 stays transient."""
    verdict = classify(response(503, {"Retry-After": "soonish"}), now=NOW)
    assert (verdict.error_class, verdict.retry_after) == (ErrorClass.TRANSIENT, None)


def test_429_with_http_date_retry_after() -> None:
    """A 429's HTTP-date Retry-After becomes the wait."""
    verdict = classify(response(429, {"Retry-After": "Wed, 01 May 2024 12:05:00 GMT"}), now=NOW)
    assert verdict.retry_after == timedelta(minutes=5)


def test_429_with_disagreeing_wait_headers_waits_the_longer() -> None:
    """Retry-After: 30 with x-ms-retry-after-ms: 100 waits 30 s (issue 39), and says so."""
    headers = {"Retry-After": "30", "x-ms-retry-after-ms": "100"}
    c = classify(response(429, headers), now=NOW)
    assert (c.retry_after, c.wait_source) == (timedelta(seconds=30), "Retry-After")
    finer = classify(response(429, {"Retry-After": "1", "x-ms-retry-after-ms": "1500"}), now=NOW)
    assert (finer.retry_after, finer.wait_source) == (timedelta(seconds=1.5), "x-ms-retry-after-ms")


@pytest.mark.parametrize(
    ("body", "signal"),
    [
        ({"message": "You have exceeded a secondary rate limit."}, "github_secondary_rate_limit"),
        ({"message": "You have triggered an abuse detection mechanism."},
         "github_secondary_rate_limit"),
        ([{"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}],
         "REQUEST_LIMIT_EXCEEDED"),
        ({"message": "API rate limit exceeded for 1.2.3.4."}, None),
    ],
)  # fmt: skip
def test_provider_rate_limit_signals_without_a_wait_are_named(
    body: object, signal: str | None
) -> None:
    """A 403 rate-limit body with no header is a rate limit naming its provider signal,
    for which the pacing has a provider-sized first wait (issue 39)."""
    c = classify(httpx.Response(403, json=body, request=REQUEST), now=NOW)
    assert c.error_class is ErrorClass.RATE_LIMITED
    assert (c.signal, c.retry_after) == (signal, None)


def test_429_with_only_a_reset_waits_until_the_reset() -> None:
    """Without Retry-After, an exhausted quota's reset gives both the wait and the instant."""
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW.timestamp()) + 90)}
    verdict = classify(response(429, headers), now=NOW)
    assert verdict.retry_after == timedelta(seconds=90)
    assert verdict.rate_limit_reset == NOW + timedelta(seconds=90)


def test_retry_after_wins_over_rate_limit_reset_for_the_wait() -> None:
    """Retry-After is the wait, and no reset is reported beside it, so a consumer taking
    the later of the two cannot pick the reset (IETF RateLimit draft)."""
    headers = {"Retry-After": "5", "RateLimit": "limit=10, remaining=0, reset=60"}
    verdict = classify(response(429, headers), now=NOW)
    assert verdict.retry_after == timedelta(seconds=5)
    assert verdict.rate_limit_reset is None
    assert verdict.wait_source == "Retry-After"


def test_retry_after_10_beats_structured_ratelimit_t_100() -> None:
    """Retry-After: 10 with RateLimit: r=0;t=100 waits 10 s."""
    headers = {"Retry-After": "10", "RateLimit": '"default";r=0;t=100'}
    verdict = classify(response(429, headers), now=NOW)
    assert (verdict.retry_after, verdict.rate_limit_reset) == (timedelta(seconds=10), None)


@pytest.mark.parametrize(
    ("headers", "source"),
    [
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}, "X-RateLimit-Reset"),
        ({"RateLimit": '"default";r=0;t=30'}, "RateLimit"),
        ({"retry-after-ms": "30000"}, "retry-after-ms"),
    ],
)
def test_wait_source_names_the_header(headers: dict[str, str], source: str) -> None:
    """wait_source says which signal gave the wait (shown as the resource's paced reason)."""
    verdict = classify(response(429, headers), now=NOW)
    assert verdict.retry_after == timedelta(seconds=30) and verdict.wait_source == source


def test_rate_limits_do_not_count_for_the_breaker() -> None:
    """Every rate-limited verdict (429, 403 quota, 503 with a wait, 509) spares the breaker."""
    cases = [
        response(429),
        response(403, {"X-RateLimit-Remaining": "0"}),
        response(503, {"Retry-After": "3"}),
        response(509),
    ]
    for r in cases:
        verdict = classify(r, now=NOW)
        assert verdict.error_class is ErrorClass.RATE_LIMITED, r.status_code
        assert verdict.counts_for_breaker is False


def test_413_with_retry_after_is_retryable_with_the_wait() -> None:
    """413 + Retry-After is temporary (RFC 9110): retried after the wait, breaker spared."""
    verdict = classify(response(413, {"Retry-After": "30"}), now=NOW)
    assert verdict.error_class is ErrorClass.TRANSIENT and verdict.retryable
    assert verdict.retry_after == timedelta(seconds=30)
    assert verdict.counts_for_breaker is False
    assert classify(response(413), now=NOW).error_class is ErrorClass.VALIDATION


def test_handler_wait_of_3_000_000_days_is_clamped() -> None:
    """A handler's absurd retry_after is clamped to MAX_WAIT, still marked as the handler's."""
    exc = RetryableError("later", retry_after=timedelta(days=3_000_000))
    verdict = classify(exc=exc, now=NOW)
    assert verdict.retry_after == synckit.errors.MAX_WAIT
    assert verdict.wait_source == "handler"


def test_rate_limit_reset_only_when_nothing_remains() -> None:
    """A quota with requests left is no reset instant."""
    headers = {"X-RateLimit-Remaining": "10", "X-RateLimit-Reset": "60"}
    assert classify(response(500, headers), now=NOW).rate_limit_reset is None


def test_naive_now_is_accepted() -> None:
    """A naive clock is treated as UTC instead of failing the arithmetic."""
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}
    verdict = classify(response(429, headers), now=NOW.replace(tzinfo=None))
    assert verdict.retry_after == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60"}, None),
        ({"Retry-After": "60"}, None),
        ({"RateLimit": '"default";r=0;t=60'}, None),
        ({"RateLimit": "limit=100, remaining=0, reset=60"}, None),
        ({}, {"message": "API rate limit exceeded for 203.0.113.7."}),
        ({}, {"message": "You have exceeded a secondary rate limit. Please wait."}),
        ({}, {"message": "You have triggered an abuse detection mechanism."}),
        ({}, [{"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}]),
        ({}, {"error": {"code": 403, "errors": [{"reason": "userRateLimitExceeded"}]}}),
        ({}, {"error": {"code": 403, "status": "RESOURCE_EXHAUSTED"}}),
    ],
    ids=[
        "x-ratelimit-remaining-0",
        "retry-after",
        "ietf-structured-r0",
        "ietf-combined-remaining0",
        "github-primary",
        "github-secondary",
        "github-abuse",
        "salesforce",
        "google-reason",
        "google-status",
    ],
)
def test_403_with_rate_limit_signal_is_rate_limited(headers: dict[str, str], body: object) -> None:
    """A 403 carrying rate-limit headers or a vendor rate-limit body is throttling."""
    verdict = classify(response(403, headers, json_body=body), now=NOW)
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert verdict.retryable


@pytest.mark.parametrize(
    ("headers", "content"),
    [
        ({"X-RateLimit-Remaining": "4999"}, b""),
        ({}, b'{"message": "Resource not accessible by integration"}'),
        ({}, b'[{"errorCode": "INSUFFICIENT_ACCESS"}]'),
        ({}, b"<html>Forbidden: rate limit settings are admin-only</html>"),
        ({}, b"\xff\xfe\x00garbage"),
        ({}, b"[" * 100_000),
    ],
    ids=["quota-left", "github-permission", "salesforce-access", "html", "binary", "deep"],
)
def test_403_without_rate_limit_signal_is_authorization(
    headers: dict[str, str], content: bytes
) -> None:
    """A plain 403 stays a refusal: not retried, surfaced, not counted by the breaker."""
    verdict = classify(response(403, headers, content=content), now=NOW)
    assert verdict.error_class is ErrorClass.AUTHORIZATION
    assert not verdict.retryable


# --- expected JSON -------------------------------------------------------------------


def test_2xx_html_when_json_expected_is_a_server_error() -> None:
    """A 200 maintenance page when JSON was expected is the server's failure: retried and
    counted by the breaker, not a per-record validation error."""
    resp = response(200, content=b"<html>maintenance</html>")
    verdict = classify(resp, now=NOW, expect_json=True)
    assert (verdict.error_class, verdict.retryable, verdict.counts_for_breaker) == (
        ErrorClass.SERVER_ERROR,
        True,
        True,
    )


def test_2xx_truncated_json_via_rules_is_a_server_error() -> None:
    """expect_json in the connector's rules has the same effect as the parameter."""
    rules = ClassifyRules(expect_json=True)
    verdict = classify(response(200, content=b'{"items": ['), now=NOW, rules=rules)
    assert verdict.error_class is ErrorClass.SERVER_ERROR


def test_2xx_non_utf8_body_when_json_expected_is_a_server_error() -> None:
    """Undecodable bytes are 'not JSON', never an exception."""
    verdict = classify(response(200, content=b"\xff\xfe\xfa"), now=NOW, expect_json=True)
    assert verdict.error_class is ErrorClass.SERVER_ERROR


def test_2xx_valid_json_is_not_validation() -> None:
    """A JSON body passes the JSON check."""
    verdict = classify(response(200, json_body={"ok": True}), now=NOW, expect_json=True)
    assert verdict.error_class is not ErrorClass.VALIDATION


@pytest.mark.parametrize("status", [202, 204, 205])
def test_empty_202_204_205_pass_the_json_check(status: int) -> None:
    """An empty 202/204/205 is a success under expect_json (Graph's sendMail: 202, no body)."""
    verdict = classify(response(status), now=NOW, expect_json=True)
    assert verdict.error_class is ErrorClass.UNKNOWN


def test_202_with_a_non_json_body_still_fails_the_json_check() -> None:
    """Only an empty body is excused: a 202 carrying HTML is still not JSON."""
    verdict = classify(response(202, content=b"<html>"), now=NOW, expect_json=True)
    assert verdict.error_class is ErrorClass.SERVER_ERROR


def test_expect_json_parameter_overrides_rules() -> None:
    """expect_json=False at the call turns off the rules' JSON check."""
    rules = ClassifyRules(expect_json=True)
    verdict = classify(response(200, content=b"<html>"), now=NOW, rules=rules, expect_json=False)
    assert verdict.error_class is not ErrorClass.VALIDATION


def test_unread_streamed_response_does_not_raise() -> None:
    """A streamed response whose body was never read is classified from status and headers."""
    resp = httpx.Response(403, stream=httpx.ByteStream(b"{}"), request=REQUEST)
    assert classify(resp, now=NOW, expect_json=True).error_class is ErrorClass.AUTHORIZATION
    ok = httpx.Response(200, stream=httpx.ByteStream(b"<html>"), request=REQUEST)
    assert classify(ok, now=NOW, expect_json=True).error_class is ErrorClass.UNKNOWN


# --- connector overrides -------------------------------------------------------------


def test_by_status_override_is_not_undone_by_rate_limit_headers() -> None:
    """by_status {403: authorization} stays authorization even with rate-limit headers."""
    rules = ClassifyRules(by_status={403: ErrorClass.AUTHORIZATION})
    resp = response(403, {"X-RateLimit-Remaining": "0", "Retry-After": "30"})
    assert classify(resp, now=NOW, rules=rules).error_class is ErrorClass.AUTHORIZATION


def test_by_status_override_makes_404_retryable() -> None:
    """by_status {404: transient} turns a 404 into a retried transient error."""
    rules = ClassifyRules(by_status={404: ErrorClass.TRANSIENT})
    verdict = classify(response(404), now=NOW, rules=rules)
    assert (verdict.error_class, verdict.retryable) == (ErrorClass.TRANSIENT, True)


def test_by_status_override_of_503_is_not_undone_by_retry_after() -> None:
    """by_status {503: server_error} is kept even though Retry-After would make it throttling."""
    rules = ClassifyRules(by_status={503: ErrorClass.SERVER_ERROR})
    verdict = classify(response(503, {"Retry-After": "5"}), now=NOW, rules=rules)
    assert verdict.error_class is ErrorClass.SERVER_ERROR
    assert verdict.retry_after == timedelta(seconds=5)


def test_body_rule_marks_throttled_graphql_200_as_rate_limited() -> None:
    """A body predicate classifies a GraphQL 200 that says THROTTLED."""

    def throttled(resp: httpx.Response) -> bool:
        errors = resp.json().get("errors", [])
        return any(e.get("extensions", {}).get("code") == "THROTTLED" for e in errors)

    rules = ClassifyRules(body_rules=[(throttled, ErrorClass.RATE_LIMITED)])
    body = {"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}]}
    verdict = classify(response(200, json_body=body), now=NOW, rules=rules)
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert "body rule 0" in verdict.reason


def test_body_rule_that_raises_is_treated_as_not_matching() -> None:
    """A predicate that raises is skipped; the next rule and the defaults still apply."""

    def broken(resp: httpx.Response) -> bool:
        raise KeyError("data")

    rules = ClassifyRules(
        body_rules=[(broken, ErrorClass.VALIDATION), (lambda r: True, ErrorClass.CONFLICT)]
    )
    assert classify(response(500), now=NOW, rules=rules).error_class is ErrorClass.CONFLICT
    only_broken = ClassifyRules(body_rules=[(broken, ErrorClass.VALIDATION)])
    verdict = classify(response(500), now=NOW, rules=only_broken)
    assert verdict.error_class is ErrorClass.SERVER_ERROR


def test_body_rules_are_tried_before_by_status() -> None:
    """A matching body rule is more specific than the connector's status mapping."""
    rules = ClassifyRules(
        by_status={400: ErrorClass.VALIDATION},
        body_rules=[(lambda r: b"LOCKED" in r.content, ErrorClass.CONFLICT)],
    )
    resp = response(400, content=b'{"code": "LOCKED"}')
    assert classify(resp, now=NOW, rules=rules).error_class is ErrorClass.CONFLICT


def test_max_attempts_override_opts_into_retrying_404() -> None:
    """Raising not_found's attempt limit makes it retryable with that limit."""
    rules = ClassifyRules(max_attempts={ErrorClass.NOT_FOUND: 4})
    verdict = classify(response(404), now=NOW, rules=rules)
    assert (verdict.retryable, verdict.max_attempts) == (True, 4)


def test_max_attempts_override_can_disable_retries() -> None:
    """A limit of 1 (or nonsense like 0) means no retry."""
    rules = ClassifyRules(max_attempts={ErrorClass.TRANSIENT: 0})
    verdict = classify(response(502), now=NOW, rules=rules)
    assert (verdict.retryable, verdict.max_attempts) == (False, 1)


def test_needs_reauth_ignores_auth_attempt_override() -> None:
    """NeedsReauth never retries, whatever the auth attempt limit."""
    rules = ClassifyRules(max_attempts={ErrorClass.AUTH: 5})
    assert not classify(exc=NeedsReauth("x"), now=NOW, rules=rules).retryable


def test_rules_copy_their_mappings() -> None:
    """Mutating the dict given to ClassifyRules afterwards changes nothing."""
    by_status = {404: ErrorClass.TRANSIENT}
    rules = ClassifyRules(by_status=by_status)
    by_status[404] = ErrorClass.VALIDATION
    assert classify(response(404), now=NOW, rules=rules).error_class is ErrorClass.TRANSIENT


# --- robustness ----------------------------------------------------------------------


def test_reason_is_one_bounded_line() -> None:
    """Multi-line, huge exception messages become one line of bounded length."""
    verdict = classify(exc=RuntimeError("line one\nline two\r\n" + "x" * 10_000), now=NOW)
    assert "\n" not in verdict.reason
    assert len(verdict.reason) <= 200
    assert verdict.reason.startswith("RuntimeError: line one line two")


def test_unprintable_exception_is_classified() -> None:
    """An exception whose __str__ raises is still classified."""

    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("nope")

    verdict = classify(exc=Nasty(), now=NOW)
    assert verdict.error_class is ErrorClass.UNKNOWN
    assert "<unprintable>" in verdict.reason


_STATUS = st.integers(100, 599) | st.integers() | st.sampled_from([403, 429, 503, 200])
_NAMES = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "x-ms-retry-after-ms",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
        "content-type",
    ]
) | st.text(min_size=1, max_size=12)
_VALUES = st.text(max_size=40) | st.integers().map(str) | st.just("0")
_BODIES = (
    st.binary(max_size=300)
    | st.text(max_size=200).map(str.encode)
    | st.just(b'{"message": "rate limit"}')
    | st.just(b'[{"errorCode": "REQUEST_LIMIT_EXCEEDED"}]')
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=10,
    ).map(lambda v: json.dumps(v).encode())
)


@settings(max_examples=examples(2000), deadline=None)
@given(
    status=_STATUS,
    headers=st.lists(st.tuples(_NAMES, _VALUES), max_size=5),
    body=_BODIES,
    expect_json=st.booleans(),
    with_exc=st.booleans(),
)
def test_classify_never_raises(
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    expect_json: bool,
    with_exc: bool,
) -> None:
    """Any status, any header bytes (unicode included) and any body give a coherent verdict."""
    raw_headers = [(k.encode("utf-8"), v.encode("utf-8")) for k, v in headers]
    resp = httpx.Response(status, headers=raw_headers, content=body, request=REQUEST)
    exc = httpx.ReadError("x") if with_exc else None
    verdict = classify(resp, exc, now=NOW, expect_json=expect_json)
    assert verdict.retryable is (verdict.max_attempts is not None and verdict.max_attempts > 1)
    assert verdict.retry_after is None or verdict.retry_after >= timedelta(0)
    assert "\n" not in verdict.reason


def test_errors_package_all_is_sorted_and_complete() -> None:
    """synckit.errors.__all__ is sorted (ruff's isort style) and names every public name."""
    names = synckit.errors.__all__

    def isort_key(name: str) -> tuple[int, str]:
        # Constants first, then classes, then functions, as ruff's RUF022 orders them.
        kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
        return (kind, name)

    assert names == sorted(names, key=isort_key)
    public = {
        name
        for name, value in vars(synckit.errors).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("synckit")
    }
    assert public <= set(names)
    assert all(hasattr(synckit.errors, name) for name in names)


# --- hostile exception objects ---------------------------------------------------------

_RAISED = st.sampled_from(
    [RuntimeError, KeyError, AttributeError, ValueError, TypeError, RecursionError, LookupError]
)
_BASES = st.sampled_from(
    [
        Exception,
        ValueError,
        TimeoutError,
        ConnectionError,
        httpx.ReadError,
        httpx.DecodingError,
        httpx.HTTPStatusError,
        json.JSONDecodeError,
        RetryableError,
        RateLimited,
        NeedsReauth,
        PermanentError,
    ]
)
_HOOKS = st.sets(
    st.sampled_from(
        [
            "__str__",
            "__repr__",
            "__getattr__",
            "__getattribute__",
            "__class__",
            "classification",
            "retry_after",
            "response",
            "args",
        ]
    )
)


class _OddDelta(timedelta):
    """A timedelta whose comparisons raise."""

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no order")

    __gt__ = __le__ = __ge__ = __lt__  # type: ignore[assignment]


_ODD_VALUES = st.sampled_from(
    [None, "soon", -5, 10**30, timedelta(seconds=-3), timedelta.max, _OddDelta(seconds=7), object()]
)


def _hostile_exception(
    base: type[BaseException], hooks: set[str], raised: type[Exception], value: object
) -> BaseException:
    def boom(*_args: object, **_kwargs: object) -> object:
        raise raised("hostile")

    namespace: dict[str, object] = {"__init__": lambda self: None}
    for hook in hooks:
        if hook in {"__str__", "__repr__", "__getattr__", "__getattribute__"}:
            namespace[hook] = boom
        else:
            namespace[hook] = property(boom)
    if "retry_after" not in hooks:
        namespace["retry_after"] = value
    if "response" not in hooks:
        namespace["response"] = value
    hostile = type("Hostile", (base,), namespace)
    return hostile()  # type: ignore[no-any-return]


@settings(max_examples=examples(1000), deadline=None)
@given(base=_BASES, hooks=_HOOKS, raised=_RAISED, value=_ODD_VALUES, with_response=st.booleans())
def test_classify_never_raises_on_hostile_exceptions(
    base: type[BaseException],
    hooks: set[str],
    raised: type[Exception],
    value: object,
    with_response: bool,
) -> None:
    """An exception whose attributes, __class__, __str__ or lookups raise anything is still
    classified: one bounded line, a wait within bounds."""
    exc = _hostile_exception(base, hooks, raised, value)
    resp = response(500) if with_response else None
    verdict = classify(resp, exc, now=NOW)
    assert isinstance(verdict.error_class, ErrorClass)
    assert "\n" not in verdict.reason and len(verdict.reason) <= 200
    assert verdict.retry_after is None or timedelta(0) <= verdict.retry_after


def test_property_raising_runtime_error_on_classification_is_classified() -> None:
    """The issue's case: a ``classification`` property that raises RuntimeError."""

    class Odd(Exception):
        @property
        def classification(self) -> object:
            raise RuntimeError("boom")

    assert classify(exc=Odd("x"), now=NOW).error_class is ErrorClass.UNKNOWN


def test_getattr_raising_key_error_is_classified_by_its_type() -> None:
    """A ``__getattr__`` raising KeyError hides no attribute from the type table."""

    class Odd(TimeoutError):
        def __getattr__(self, name: str) -> object:
            raise KeyError(name)

    verdict = classify(exc=Odd("slow"), now=NOW)
    assert verdict.error_class is ErrorClass.TRANSIENT
    assert verdict.reason == "Odd: slow"


def test_hostile_handler_wait_is_ignored_not_raised() -> None:
    """A RateLimited whose retry_after property raises is still rate limited, with no wait."""

    class Odd(RateLimited):
        @property  # type: ignore[override]
        def retry_after(self) -> timedelta:
            raise RuntimeError("boom")

        @retry_after.setter
        def retry_after(self, value: object) -> None:
            pass

    verdict = classify(exc=Odd("slow down"), now=NOW)
    assert verdict.error_class is ErrorClass.RATE_LIMITED
    assert verdict.retry_after is None

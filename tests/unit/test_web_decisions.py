"""The console's pure decisions: where it may listen, which tokens and redirects pass,
and the words for why a tenant waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.web.explain import duration_text, tenant_why
from synckit.web.security import (
    bind_refusal,
    csrf_valid,
    host_refusal,
    is_loopback,
    origin_allowed,
    safe_next,
    token_valid,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TOKEN = "0123456789abcdef-token"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"])
def test_loopback_hosts_need_no_token(host: str) -> None:
    assert is_loopback(host) and bind_refusal(host, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.5", "example.com", "10.0.0.1"])
def test_any_other_host_needs_a_token(host: str) -> None:
    assert not is_loopback(host)
    assert "access token" in (bind_refusal(host, None) or "")
    assert bind_refusal(host, TOKEN) is None


def test_a_short_token_is_refused_anywhere() -> None:
    assert "16 characters" in (bind_refusal("127.0.0.1", "short") or "")


@given(st.text(max_size=40), st.text(max_size=40))
def test_a_token_passes_only_when_equal(expected: str, given_: str) -> None:
    assert token_valid(expected, given_) == (not expected or expected == given_)


@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=60)))
def test_csrf_passes_only_when_the_form_repeats_a_real_cookie(
    cookie: str, submitted: str | None
) -> None:
    assert csrf_valid(cookie, submitted) == (len(cookie) >= 16 and submitted == cookie)


@pytest.mark.parametrize(
    ("origin", "host", "ok"),
    [
        (None, "127.0.0.1:8080", True),
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("http://evil.example", "127.0.0.1:8080", False),
        ("null", "127.0.0.1:8080", False),
        ("http://127.0.0.1:9999", "127.0.0.1:8080", False),
    ],
)
def test_origin(origin: str | None, host: str, ok: bool) -> None:
    assert origin_allowed(origin, host) is ok


@given(st.text(max_size=60))
def test_safe_next_never_leaves_the_site(target: str) -> None:
    out = safe_next(target, "/home")
    assert out.startswith("/") and not out.startswith("//") and "\\" not in out
    assert out in (target, "/home")


def why(**kw: object) -> list[str]:
    values: dict[str, object] = {
        "status": "active",
        "status_reason": None,
        "breaker": "closed",
        "cooldown_until": None,
        "next_available_at": None,
        "paced_reason": None,
        "max_in_flight": None,
        "running": 0,
        "now": NOW,
    }
    values.update(kw)
    return [w.text for w in tenant_why(**values)]  # type: ignore[arg-type]


def test_nothing_holds_a_healthy_tenant() -> None:
    assert why() == []
    assert why(next_available_at=NOW - timedelta(seconds=1)) == []


def test_each_reason_in_words() -> None:
    assert why(status="paused", status_reason="budget") == ["paused: budget"]
    assert why(status="needs_reauth", status_reason="invalid_grant") == [
        "needs re-authorisation: invalid_grant"
    ]
    assert why(next_available_at=NOW + timedelta(seconds=90), paced_reason="Retry-After") == [
        "paced until 2026-01-01 12:01:30 UTC (in 1m 30s) (Retry-After)"
    ]
    assert why(breaker="open", cooldown_until=NOW + timedelta(minutes=5)) == [
        "breaker open until 2026-01-01 12:05:00 UTC (in 5m 00s)"
    ]
    assert why(breaker="open", cooldown_until=NOW - timedelta(minutes=5)) == [
        "breaker open, cool-down over: the next job is a probe"
    ]
    assert why(max_in_flight=2, running=2) == ["in-flight limit reached: 2 of 2 running"]
    assert why(max_in_flight=2, running=1) == []


def test_an_open_breaker_is_not_also_called_pacing() -> None:
    """Both write next_available_at; while the breaker is open it is the cool-down."""
    texts = why(breaker="open", next_available_at=NOW + timedelta(minutes=1))
    assert len(texts) == 1 and texts[0].startswith("breaker open until")


@given(
    status=st.sampled_from(["active", "paused", "needs_reauth"]),
    breaker=st.sampled_from(["closed", "open", "half_open"]),
    paced=st.one_of(st.none(), st.integers(-3600, 3600)),
    limit=st.one_of(st.none(), st.integers(1, 5)),
    running=st.integers(0, 6),
)
def test_every_reason_has_one_line_and_only_when_it_holds(
    status: str, breaker: str, paced: int | None, limit: int | None, running: int
) -> None:
    until = NOW + timedelta(seconds=paced) if paced is not None else None
    out = tenant_why(
        status=status,
        status_reason="r",
        breaker=breaker,
        cooldown_until=until,
        next_available_at=until,
        paced_reason="Retry-After",
        max_in_flight=limit,
        running=running,
        now=NOW,
    )
    kinds = [w.kind for w in out]
    assert len(kinds) == len(set(kinds))
    assert ("paused" in kinds) == (status == "paused")
    assert ("needs_reauth" in kinds) == (status == "needs_reauth")
    assert ("breaker" in kinds) == (breaker != "closed")
    # As the claim's gate: an open breaker's cool-down is its pace (said once); a breaker
    # that is not closed lets its probe through whatever runs.
    assert ("paced" in kinds) == (breaker != "open" and paced is not None and paced > 0)
    assert ("in_flight" in kinds) == (
        breaker == "closed" and limit is not None and running >= limit
    )


@given(st.floats(0, 10 * 86400))
def test_durations_are_short(seconds: float) -> None:
    assert len(duration_text(seconds)) <= 8


@pytest.mark.parametrize(
    ("host", "token", "allowed", "refused"),
    [
        ("127.0.0.1:8080", None, (), False),
        ("localhost:8080", None, (), False),
        ("LOCALHOST", None, (), False),
        ("[::1]:8080", None, (), False),
        ("app.localhost:8080", None, (), False),
        ("evil.example:8080", None, (), True),  # DNS rebinding's shape
        ("evil.example", None, (), True),
        ("10.0.0.5:8080", None, (), True),
        ("", None, (), True),
        (None, None, (), True),
        ("127.0.0.1.evil.example", None, (), True),
        ("console.example.com", "t" * 16, (), False),  # a token guards every request
        ("console.example.com:443", "t" * 16, ("console.example.com",), False),
        ("evil.example", "t" * 16, ("console.example.com",), True),
        ("127.0.0.1:8080", "t" * 16, ("console.example.com",), False),
    ],
)
def test_host_check(
    host: str | None, token: str | None, allowed: tuple[str, ...], refused: bool
) -> None:
    """Issue 34: a loopback console answers only to loopback names; --allowed-host names
    the public ones of a console behind a token."""
    assert (host_refusal(host, token=token, allowed=allowed) is not None) is refused

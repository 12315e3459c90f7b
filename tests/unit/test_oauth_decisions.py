"""The OAuth lifecycle's pure decisions: refresh margin, refresh step, 401 verdict, reason."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from synckit.redaction import redact_text
from synckit.runtime.credentials.oauth import (
    MAX_401_RETRIES,
    reauth_reason,
    refresh_due,
    refresh_margin,
    refresh_step,
    unauthorized_verdict,
)
from synckit.runtime.credentials.secrets import TokenSet

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEEWAY = timedelta(seconds=60)
lifetimes = st.floats(min_value=0.05, max_value=48 * 3600, allow_nan=False)


def token(life: float, *, access: str | None = "a", issued: datetime = T0) -> TokenSet:
    return TokenSet(
        access_token=access,
        refresh_token="r",
        expires_at=issued + timedelta(seconds=life),
        issued_at=issued,
    )


@given(lifetimes)
def test_the_margin_is_a_quarter_of_the_lifetime_at_most_the_leeway(life: float) -> None:
    """2 s tokens get 0.5 s, 24 h tokens the leeway: margin = min(leeway, lifetime / 4)."""
    margin = refresh_margin(token(life), LEEWAY)
    assert margin == min(LEEWAY, timedelta(seconds=life) / 4)


@given(lifetimes, st.floats(min_value=0, max_value=1, allow_nan=False))
def test_a_token_is_never_due_before_three_quarters_of_its_life(life: float, at: float) -> None:
    """So a token of any length costs at most one refresh per half-lifetime."""
    t = token(life)
    now = T0 + timedelta(seconds=life * at)
    due = refresh_due(t, now, LEEWAY)
    if at < 0.75:
        assert not due
    if at >= 1:
        assert due


def test_due_without_a_token_or_an_access_token_and_never_without_an_expiry() -> None:
    """Nothing to send: due. Unknown expiry: not due (a 401 will say)."""
    assert refresh_due(None, T0, LEEWAY)
    assert refresh_due(token(3600, access=None), T0, LEEWAY)
    assert not refresh_due(TokenSet("a", "r"), T0 + timedelta(days=999), LEEWAY)
    unknown_issue = TokenSet("a", "r", expires_at=T0 + timedelta(seconds=59))
    assert refresh_due(unknown_issue, T0, LEEWAY)  # issue time unknown: the leeway


def test_refresh_step_for_every_combination() -> None:
    """use_stored > take (lease free/expired) > use_own (lease held, own valid) > wait."""
    fresh = token(3600, access="fresh")
    # Due (inside its margin) but not yet expired at T0; and expired.
    stale_valid = token(3600, access="stale", issued=T0 - timedelta(seconds=3560))
    dead = token(10, access="dead", issued=T0 - timedelta(seconds=20))
    missing = None
    leases = [(None, None), ("w", T0 - timedelta(seconds=1)), ("w", T0 + timedelta(seconds=5))]
    for stored, own, failed, (owner, until) in itertools.product(
        [fresh, stale_valid, dead, missing], [fresh, stale_valid, dead, None], [None, fresh], leases
    ):
        step = refresh_step(
            stored=stored,
            own=own,
            failed=failed,
            lease_owner=owner,
            lease_until=until,
            now=T0,
            leeway=LEEWAY,
        )
        held = until is not None and until > T0
        if stored is fresh and failed is None:
            assert step == "use_stored"
        elif not held:
            assert step == "take"
        elif failed is None and own in (fresh, stale_valid):
            assert step == "use_own"
        else:
            assert step == "wait"


@given(
    st.booleans(),
    st.floats(min_value=-10, max_value=10, allow_nan=False),
    st.booleans(),
    st.integers(min_value=0, max_value=5),
)
def test_a_401_refuses_only_on_a_token_minted_for_the_request_inside_its_life(
    minted: bool, sent_offset: float, known_expiry: bool, retries: int
) -> None:
    """Evidence or a bounded retry: never needs_reauth for a re-read or expired token."""
    expires_at = T0 if known_expiry else None
    answered_at = T0 + timedelta(seconds=sent_offset)
    verdict = unauthorized_verdict(
        minted=minted, answered_at=answered_at, expires_at=expires_at, retries=retries
    )
    inside = expires_at is None or answered_at < expires_at
    if minted and inside:
        assert verdict == "refuse"
    elif retries >= MAX_401_RETRIES:
        assert verdict == "give_up"
    else:
        assert verdict == "refresh"


@given(st.text(max_size=2000), st.from_regex(r"[a-z0-9]{1,40}", fullmatch=True))
def test_the_reason_is_the_cause_first_bounded_with_one_hint(cause: str, tenant: str) -> None:
    """Within the column, the cause first, the hint once."""
    reason = reauth_reason(cause, tenant)
    assert len(reason) <= 500
    words = redact_text(" ".join(cause.split()))
    assert reason.startswith(words[:300] or "credentials refused")
    assert reason.count(f"tenant {tenant!r} needs re-authorisation") == 1 or len(words) >= 300


def test_a_refusal_quoting_tokens_is_stored_redacted_with_its_hint_whole() -> None:
    """A provider's error code and description are untrusted text: a bearer token, another
    client's secret or a token in a URL never reach the stored reason, and the masked
    value does not run into the hint after it."""
    from authlib.integrations.base_client import OAuthError

    from synckit.runtime.credentials.oauth import token_endpoint_error

    leaky = OAuthError(
        error="invalid_grant",
        description="Bearer ghp_abcdefghijklmnopqrstuvwxyz0123456789 and "
        "client_secret=other-client-s3cr3t, see https://idp/x?access_token=tok_SEEKRIT_4242",
    )
    refused = token_endpoint_error(leaky, None, "refresh_token", T0, secrets=("mine",))
    reason = reauth_reason(str(refused), "acme")
    for secret in ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "other-client-s3cr3t",
                   "tok_SEEKRIT_4242"):  # fmt: skip
        assert secret not in reason
    assert reason.startswith("the token endpoint refused the refresh_token grant: invalid_grant")
    assert reason.endswith(
        "; tenant 'acme' needs re-authorisation: run `synckit tenants connect acme` "
        "or `synckit tenants reauth acme`"
    )
    assert redact_text(reason) == reason  # stored again by the store: unchanged

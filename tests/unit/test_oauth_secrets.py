"""Token sets and their encryption at rest (no database, no network)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from synckit.errors.exceptions import ConfigurationError, InsecureTokenStorageWarning
from synckit.runtime.credentials.oauth import OAuth2Config
from synckit.runtime.credentials.secrets import (
    FERNET_MARKER,
    MAX_TOKEN_LIFETIME,
    PLAINTEXT_MARKER,
    TokenCipher,
    TokenSet,
    token_lifetime,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ACCESS = "at-SECRET-access-1234567890"
REFRESH = "rt-SECRET-refresh-0987654321"
TOKENS = TokenSet(ACCESS, REFRESH, expires_at=NOW + timedelta(hours=1), scope="read")


def test_token_set_repr_and_str_mask_both_tokens() -> None:
    """Neither repr nor str of a TokenSet shows a token."""
    for text in (repr(TOKENS), str(TOKENS), f"{TOKENS}", repr([TOKENS])):
        assert ACCESS not in text and REFRESH not in text
        assert "***" in text


def test_oauth2_config_repr_masks_the_client_secret() -> None:
    """The client secret is not in an OAuth2Config's repr."""
    cfg = OAuth2Config("https://idp/token", "client", "s3cr3t-client-secret")
    assert "s3cr3t-client-secret" not in repr(cfg)


def test_from_token_response_counts_expiry_from_now_and_keeps_unrotated_refresh() -> None:
    """expires_in is counted from now; a response without refresh_token keeps the old one."""
    t = TokenSet.from_token_response(
        {"access_token": "a", "expires_in": 3600, "token_type": "bearer"},
        now=NOW,
        previous_refresh_token="old-rt",
    )
    assert t.expires_at == NOW + timedelta(hours=1)
    assert t.refresh_token == "old-rt"
    assert t.authorization == "Bearer a"


def test_from_token_response_takes_a_rotated_refresh_token() -> None:
    """A response with a new refresh token replaces the old one."""
    t = TokenSet.from_token_response(
        {"access_token": "a", "refresh_token": "new-rt"}, now=NOW, previous_refresh_token="old"
    )
    assert t.refresh_token == "new-rt"
    assert t.expires_at is None


def test_from_token_response_without_access_token_fails_without_echoing_it() -> None:
    """A response with no access token is an error whose message quotes nothing of it."""
    with pytest.raises(ValueError) as info:
        TokenSet.from_token_response({"refresh_token": REFRESH}, now=NOW)
    assert REFRESH not in str(info.value)


@pytest.mark.parametrize(
    ("expires_at", "expired"),
    [
        (None, False),
        (NOW + timedelta(seconds=61), False),
        (NOW + timedelta(seconds=60), True),
        (NOW - timedelta(seconds=1), True),
    ],
)
def test_expires_within_leeway(expires_at: datetime | None, expired: bool) -> None:
    """A token is refreshed once it is within the leeway of its expiry; unknown expiry is valid."""
    t = TokenSet("a", expires_at=expires_at)
    assert t.expires_within(timedelta(seconds=60), NOW) is expired


def test_seal_and_open_round_trip_and_the_bytes_hide_the_tokens() -> None:
    """Sealed tokens are Fernet ciphertext: the stored bytes contain neither token."""
    cipher = TokenCipher([Fernet.generate_key().decode()])
    sealed = cipher.seal(TOKENS)
    assert sealed.startswith(FERNET_MARKER)
    assert ACCESS.encode() not in sealed and REFRESH.encode() not in sealed
    assert cipher.open(sealed) == TOKENS


def test_without_a_key_storing_is_refused_with_a_clear_message() -> None:
    """No SYNCKIT_SECRET_KEY and no dev flag: seal raises ConfigurationError naming both."""
    cipher = TokenCipher.from_env({})
    with pytest.raises(ConfigurationError) as info:
        cipher.seal(TOKENS)
    message = str(info.value)
    assert "SYNCKIT_SECRET_KEY" in message and "SYNCKIT_INSECURE_DEV_TOKENS" in message
    assert "unencrypted" in message


def test_dev_flag_stores_plaintext_behind_a_marker_with_a_warning() -> None:
    """SYNCKIT_INSECURE_DEV_TOKENS=1 without a key: plaintext with a marker, and a warning."""
    cipher = TokenCipher.from_env({"SYNCKIT_INSECURE_DEV_TOKENS": "1"})
    with pytest.warns(InsecureTokenStorageWarning, match="UNENCRYPTED"):
        sealed = cipher.seal(TOKENS)
    assert sealed.startswith(PLAINTEXT_MARKER)
    assert cipher.open(sealed) == TOKENS


def test_plaintext_tokens_are_not_read_without_the_dev_flag() -> None:
    """Development tokens are refused once the dev flag is off."""
    sealed = PLAINTEXT_MARKER + json.dumps(TOKENS.to_json()).encode()
    with pytest.raises(ConfigurationError, match="development tokens"):
        TokenCipher([Fernet.generate_key().decode()]).open(sealed)


def test_a_key_takes_precedence_over_the_dev_flag() -> None:
    """With a key set, tokens are encrypted even if the dev flag is on too."""
    key = Fernet.generate_key().decode()
    cipher = TokenCipher.from_env({"SYNCKIT_SECRET_KEY": key, "SYNCKIT_INSECURE_DEV_TOKENS": "1"})
    assert cipher.seal(TOKENS).startswith(FERNET_MARKER)


def test_an_invalid_key_is_a_configuration_error_that_does_not_echo_it() -> None:
    """A malformed key is refused up front, and the message does not contain it."""
    with pytest.raises(ConfigurationError) as info:
        TokenCipher.from_env({"SYNCKIT_SECRET_KEY": "not-a-fernet-key-but-secret"})
    assert "not-a-fernet-key-but-secret" not in str(info.value)


def test_opening_with_the_wrong_key_says_so() -> None:
    """Tokens sealed under another key: a ConfigurationError about the key, not a crash."""
    sealed = TokenCipher([Fernet.generate_key().decode()]).seal(TOKENS)
    with pytest.raises(ConfigurationError, match="does not hold the key"):
        TokenCipher([Fernet.generate_key().decode()]).open(sealed)


def test_opening_encrypted_tokens_without_a_key_says_so() -> None:
    sealed = TokenCipher([Fernet.generate_key().decode()]).seal(TOKENS)
    with pytest.raises(ConfigurationError, match="SYNCKIT_SECRET_KEY is not set"):
        TokenCipher.from_env({}).open(sealed)


def test_key_rotation_decrypts_with_old_keys_and_encrypts_with_the_first() -> None:
    """'new,old' keys: tokens sealed under the old key open; new seals use the new key."""
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    sealed_old = TokenCipher([old]).seal(TOKENS)
    rotating = TokenCipher.from_env({"SYNCKIT_SECRET_KEY": f"{new},{old}"})
    assert rotating.open(sealed_old) == TOKENS
    assert TokenCipher([new]).open(rotating.seal(TOKENS)) == TOKENS


def test_corrupt_stored_bytes_are_a_configuration_error() -> None:
    """Garbage where tokens should be is reported, never a traceback from json."""
    cipher = TokenCipher([Fernet.generate_key().decode()], insecure_dev=True)
    for garbage in (b"", b"xyz", PLAINTEXT_MARKER + b"{not json", PLAINTEXT_MARKER + b"{}"):
        with pytest.raises(ConfigurationError):
            cipher.open(garbage)


def test_issue_time_and_a_refresh_token_alone_survive_sealing() -> None:
    """issued_at (the lifetime) is kept; a set with only a refresh token is valid."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    cipher = TokenCipher([Fernet.generate_key().decode()])
    issued = TokenSet.from_token_response({"access_token": "a", "expires_in": 2}, now=now)
    assert issued.issued_at == now and cipher.open(cipher.seal(issued)) == issued
    alone = TokenSet(access_token=None, refresh_token="r")
    assert not alone.usable and cipher.open(cipher.seal(alone)) == alone
    with pytest.raises(ValueError, match="access token or a refresh token"):
        TokenSet(access_token=None)


_ANY_JSON_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["3600", "3600.5", "inf", "-inf", "nan", "1e400", " 60 ", "never"]),
    st.lists(st.integers(), max_size=2),
)


@given(expires_in=_ANY_JSON_VALUE, expires_at=_ANY_JSON_VALUE)
def test_any_expiry_a_token_endpoint_sends_gives_a_lifetime_within_the_cap(
    expires_in: object, expires_at: object
) -> None:
    """Whatever a server sends as expires_in / expires_at: no exception (an overflow lost
    a refresh the server had made), and a lifetime from 0 to a year, or none."""
    now = datetime(2026, 11, 28, tzinfo=UTC)
    got = token_lifetime(expires_in, expires_at, now)
    assert got is None or timedelta(0) <= got <= MAX_TOKEN_LIFETIME
    tokens = TokenSet.from_token_response(
        {"access_token": "a", "expires_in": expires_in, "expires_at": expires_at}, now=now
    )
    assert tokens.expires_at == (None if got is None else now + got)


def test_token_lifetimes_as_the_rfc_and_common_providers_send_them() -> None:
    now = datetime(2026, 11, 28, tzinfo=UTC)
    assert token_lifetime(3600, None, now) == timedelta(hours=1)
    assert token_lifetime("3599.5", None, now) == timedelta(seconds=3599.5)
    assert token_lifetime(None, now.timestamp() + 60, now) == timedelta(seconds=60)
    assert token_lifetime(60, now.timestamp() + 9999, now) == timedelta(seconds=60)
    assert token_lifetime(-5, None, now) == timedelta(0)  # already expired
    assert token_lifetime(1e300, None, now) == MAX_TOKEN_LIFETIME
    assert token_lifetime("never", None, now) is None
    assert token_lifetime(True, None, now) is None

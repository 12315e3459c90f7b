"""The one redaction step: every secret shape the hostile audit found, generated."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]
from pydantic import BaseModel, SecretStr
from secret_shapes import SHAPES

from synckit import redaction
from synckit.runtime.observe.logging import (
    bind_known_secrets,
    is_secret_key,
    redact,
    redact_secrets,
    redact_text,
    scrub_values,
    secret_values,
)

# Token-like secrets: what API keys, OAuth tokens and webhook paths are made of.
SECRET = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=12
).map(lambda s: "Zq" + s)  # never all digits, never a word
# Secrets with punctuation, for the shapes that are quoted or delimited.
WIDE_SECRET = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/!$%()*",
    min_size=12,
).map(lambda s: "Zq" + s)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@settings(max_examples=40, deadline=None)
@given(secret=SECRET)
def test_no_generated_secret_survives_any_shape(shape: str, secret: str) -> None:
    """Each audited shape, with any token-like secret, is masked (and stays masked)."""
    out = redact_text(SHAPES[shape](secret))
    assert secret not in out, out
    assert redact_text(out) == out  # redacting twice changes nothing


@pytest.mark.parametrize(
    "shape",
    [
        "camelCase clientSecret json",
        "json inside json",
        "password with spaces json",
        "python repr",
        "X-Token-Value header",
        "pwd=",
    ],
)
@settings(max_examples=40, deadline=None)
@given(secret=WIDE_SECRET)
def test_secrets_with_punctuation_are_masked_whole(shape: str, secret: str) -> None:
    """Quoted and delimited values are masked to their end, whatever their characters."""
    if shape == "pwd=":
        secret = secret.replace(";", "")
    out = redact_text(SHAPES[shape](secret))
    assert secret not in out, out


@settings(max_examples=60, deadline=None)
@given(secret=WIDE_SECRET, prose=st.sampled_from(["the key {} was refused", "{}", "x{}y"]))
def test_known_values_are_scrubbed_in_any_form(secret: str, prose: str) -> None:
    """A tenant's own secret is scrubbed by value: plain, URL-encoded, JSON-escaped."""
    from urllib.parse import quote

    text = " | ".join([prose.format(secret), quote(secret, safe=""), json.dumps({"note": secret})])
    out = redact_text(text, known=[secret])
    assert secret not in out and quote(secret, safe="") not in out
    with bind_known_secrets([secret]):
        assert secret not in redact_text(text)
    assert secret not in json.dumps(redact({"a": [text]}, known=[secret]))


def test_known_values_are_bound_per_context_only() -> None:
    """Bound secrets apply inside the block and not after it; short values are ignored."""
    with bind_known_secrets(["Opaque-Value-123"]):
        assert redact_text("got Opaque-Value-123") == "got ***"
    assert redact_text("got Opaque-Value-123") == "got Opaque-Value-123"
    assert scrub_values("a cat", ["cat"]) == "a cat"


def test_a_repeated_text_is_redacted_alike_and_bound_secrets_still_apply() -> None:
    """Short texts with a hint are answered from a cache of the rules' results: the same
    answer every time, and a value bound later is still scrubbed (before the cache)."""
    text = "url=https://u:Zqpassword1234@h/x"
    first = redact_text(text)
    assert "Zqpassword1234" not in first
    assert redact_text(text) == first
    assert redact_text("at: Opaque-Value-123") == "at: Opaque-Value-123"
    with bind_known_secrets(["Opaque-Value-123"]):
        assert redact_text("at: Opaque-Value-123") == "at: ***"
    assert redact_text("at: Opaque-Value-123") == "at: Opaque-Value-123"


def test_secret_values_reads_nested_secret_fields() -> None:
    """secret_values finds SecretStr fields at any depth of a config model."""

    class Inner(BaseModel):
        pat: SecretStr
        label: str = "x"

    class Config(BaseModel):
        webhook_url: SecretStr
        inner: Inner
        extra: list[Inner]

    cfg = Config(
        webhook_url=SecretStr("https://hooks/x/y"),
        inner=Inner(pat=SecretStr("pat-1")),
        extra=[Inner(pat=SecretStr("pat-2"))],
    )
    assert set(secret_values(cfg)) == {"https://hooks/x/y", "pat-1", "pat-2"}


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("accessToken", True),
        ("refreshToken", True),
        ("clientSecret", True),
        ("X-Token-Value", True),
        ("aws_secret_access_key", True),
        ("pwd", True),
        ("Set-Cookie", True),
        ("apiKey", True),
        ("privateKey", True),
        ("key", False),  # an ordering key, a resource key: ?key= in URLs is masked
        ("resource_key", False),
        ("unique_key", False),
        ("claim_token", False),
        ("token_expires_at", False),
        ("expires_in", False),
        ("token_type", False),
        ("tokens_issued_count", False),
        ("status_code", False),
        ("message", False),
    ],
)
def test_secret_key_names(key: str, secret: bool) -> None:
    """Key names: camelCase and header spellings count; names about a secret do not."""
    assert is_secret_key(key) is secret


@pytest.mark.parametrize(
    "text",
    [
        "Invalid path [/v1/users]",
        "HTTP 500: upstream timed out after 30s",
        '{"code": 400, "message": "bad field: name"}',
        "the token expired",
        "job 17: resource_key=acme:graph status=dead",
    ],
)
def test_ordinary_error_text_is_left_alone(text: str) -> None:
    """Operators still read their errors: prose, codes and resource keys are not masked."""
    assert redact_text(text) == text


def test_deep_values_do_not_overflow() -> None:
    """A hostile, very deep structure is redacted without recursion errors."""
    deep: object = "Bearer abcdefgh"
    for _ in range(5000):
        deep = [deep]
    assert "abcdefgh" not in repr(redact(deep))


def _every_rule(text: str) -> str:
    """The text rules applied one after another, unconditionally (what the one search
    before them must agree with)."""
    for pattern, replacement in redaction._TEXT_RULES:
        text = pattern.sub(replacement, text)
    return text


# Texts made of the rules' own pieces, so that near-misses and matches are both common.
_RULE_PIECES = st.lists(
    st.sampled_from(
        [
            "-----BEGIN RSA PRIVATE KEY-----",
            "-----END RSA PRIVATE KEY-----",
            "\n",
            "Set-Cookie: ",
            "cookie:",
            "Bearer ",
            "basic\t",
            "?api_key=",
            "&SIG=",
            "#code=",
            "https://",
            "user:",
            "pw@",
            "@",
            "/bot",
            "123:",
            "hooks.slack.com/services/",
            "/api/webhooks/9/",
            "ghp_",
            "sk_live_",
            "xoxb-",
            "AKIA",
            "SG.",
            "eyJ",
            ".",
            "abcdefgh12",
            "ABC",
            " ",
            "=",
            "***",
            "ü",
            "-",
        ]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=examples(500), deadline=None)
@given(text=st.one_of(_RULE_PIECES, st.text(max_size=40)))
def test_the_search_before_the_rules_skips_only_texts_no_rule_changes(text: str) -> None:
    assert redaction._apply_rules(text) == redaction._mask_pairs_if_hinted(_every_rule(text))
    if redaction._ANY_RULE.search(text) is None:
        assert _every_rule(text) == text


@settings(max_examples=examples(300), deadline=None)
@given(
    event=st.dictionaries(
        st.sampled_from(["event", "token", "api_key", "count", "resource_key", "timestamp"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=False),
            _RULE_PIECES,
            st.lists(_RULE_PIECES, max_size=2),
            st.dictionaries(st.sampled_from(["password", "n"]), _RULE_PIECES, max_size=2),
        ),
    )
)
def test_the_log_processor_redacts_each_field_as_redact_does(event: dict[str, object]) -> None:
    expected = {k: redact(v, k) for k, v in event.items()}
    assert redact_secrets(None, "info", dict(event)) == expected

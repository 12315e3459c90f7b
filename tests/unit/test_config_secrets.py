"""Config secrets by type: which values are secrets, their sealed form, opening, masking,
re-sealing under a new key, and the one-line start-check message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.fernet import Fernet
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr
from secrets_app import VaultConfig

from synckit.errors.exceptions import (
    ConfigurationError,
    InsecureTokenStorageWarning,
    SecretCorrupt,
    SecretUnavailable,
)
from synckit.runtime.credentials.config_secrets import (
    MASK,
    dotted,
    mask_config,
    open_config,
    reseal_config,
    seal_config,
    secret_paths,
)
from synckit.runtime.credentials.keys import Unopenable, describe_unopenable
from synckit.runtime.credentials.secrets import FERNET_V1_MARKER, TokenCipher, TokenSet, key_id

K1, K2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()

CONFIG: dict[str, Any] = {
    "api_key": "key-top-0001",
    "region": "eu",
    "auth": {"user": "ann", "pat": "pat-nested-0002", "webhook_url": "https://hooks/T0/B0/x"},
    "repos": [{"name": "a", "pat": "pat-list-0003"}, {"name": "b", "pat": "pat-list-0004"}],
    "hooks": {"deploy": "hook-dict-0005"},
    "fallback": {"name": "c", "pat": "pat-union-0006"},
}
SECRETS = [
    "key-top-0001",
    "pat-nested-0002",
    "https://hooks/T0/B0/x",
    "pat-list-0003",
    "pat-list-0004",
    "hook-dict-0005",
    "pat-union-0006",
]


def test_secret_paths_follow_the_model_types_at_any_depth() -> None:
    """Top level, nested model, list and dict of models, union member; not plain str."""
    assert secret_paths(VaultConfig, CONFIG) == [
        ("api_key",),
        ("auth", "pat"),
        ("auth", "webhook_url"),
        ("repos", 0, "pat"),
        ("repos", 1, "pat"),
        ("hooks", "deploy"),
        ("fallback", "pat"),
    ]
    assert (
        secret_paths(VaultConfig, {**CONFIG, "fallback": 3})
        == secret_paths(VaultConfig, CONFIG)[:-1]
    )


def test_aliases_tuples_and_none_values() -> None:
    """A field read by its alias is found under the alias; None is no secret to seal."""
    from pydantic import Field

    class M(BaseModel):
        token: SecretStr = Field(alias="apiToken")
        pair: tuple[str, SecretStr] | None = None
        maybe: SecretStr | None = None

    assert secret_paths(M, {"apiToken": "x", "pair": ["a", "b"], "maybe": None}) == [
        ("apiToken",),
        ("pair", 1),
    ]


def test_seal_hides_every_secret_and_open_restores_the_config() -> None:
    """The stored JSON holds none of the secrets; opening gives the config back."""
    cipher = TokenCipher([K1])
    stored = seal_config(VaultConfig, CONFIG, cipher)
    text = json.dumps(stored)
    assert not [s for s in SECRETS if s in text]
    assert stored["auth"]["pat"]["$key"] == key_id(K1) and stored["region"] == "eu"
    opened, paths = open_config(stored, TokenCipher([K1]))
    assert opened == CONFIG and paths == secret_paths(VaultConfig, CONFIG)
    masked, _ = open_config(stored, None, reveal=False)
    assert masked["auth"] == {"user": "ann", "pat": MASK, "webhook_url": MASK}
    assert VaultConfig.model_validate(opened).auth.pat.get_secret_value() == "pat-nested-0002"


def test_opening_without_the_key_names_the_field_and_the_key() -> None:
    stored = seal_config(VaultConfig, CONFIG, TokenCipher([K1]))
    with pytest.raises(SecretUnavailable) as info:
        open_config(stored, TokenCipher([K2]))
    assert info.value.key_id == key_id(K1)
    assert "config field 'api_key' cannot be opened" in str(info.value)
    assert key_id(K1) in str(info.value)
    with pytest.raises(SecretUnavailable, match="SYNCKIT_SECRET_KEY is not set"):
        open_config(stored, TokenCipher([]))


def test_sealing_without_a_key_is_refused_unless_in_development() -> None:
    with pytest.raises(ConfigurationError, match="refusing to store secret config fields"):
        seal_config(VaultConfig, CONFIG, TokenCipher([]))
    assert seal_config(VaultConfig, {"region": "x"}, TokenCipher([])) == {"region": "x"}
    dev = TokenCipher([], insecure_dev=True)
    with pytest.warns(InsecureTokenStorageWarning):
        stored = seal_config(VaultConfig, CONFIG, dev)
    assert stored["api_key"] == {"$insecure": "key-top-0001"}
    assert open_config(stored, dev)[0] == CONFIG
    with pytest.raises(ConfigurationError, match="unencrypted"):
        open_config(stored, TokenCipher([K1]))


def test_reseal_moves_old_keys_and_plaintext_to_the_first_key_once() -> None:
    """Under "k2,k1": k1 values and legacy plaintext (with the model) are re-sealed;
    a second pass changes nothing; the result opens with k2 alone."""
    old = seal_config(
        VaultConfig, {**CONFIG, "auth": {"user": "u", "pat": "p-legacy"}}, TokenCipher([K1])
    )
    old["auth"]["pat"] = "p-legacy"  # a row stored before configs were sealed
    rotating = TokenCipher([K2, K1])
    new = reseal_config(old, rotating, VaultConfig)
    assert new is not None and "p-legacy" not in json.dumps(new)
    assert reseal_config(new, rotating, VaultConfig) is None
    assert open_config(new, TokenCipher([K2]))[0]["auth"]["pat"] == "p-legacy"
    assert reseal_config({"region": "eu"}, rotating, VaultConfig) is None


def test_token_sets_carry_the_key_id_and_version_1_still_opens() -> None:
    tokens = TokenSet(access_token="acc-123456", refresh_token="ref-123456")
    v1 = FERNET_V1_MARKER + Fernet(K1.encode()).encrypt(json.dumps(tokens.to_json()).encode())
    rotating = TokenCipher([K2, K1])
    assert rotating.open(v1) == tokens and not rotating.is_current(v1)
    again = rotating.reseal(v1)
    assert again is not None and rotating.reseal(again) is None
    assert TokenCipher([K2]).open(again) == tokens
    with pytest.raises(SecretUnavailable) as info:
        TokenCipher([K1]).open(again)
    assert info.value.key_id == key_id(K2) and key_id(K2) in str(info.value)


def test_mask_config_ignores_paths_that_are_gone() -> None:
    assert mask_config({"a": {"b": 1}}, [("a", "b"), ("x", 0), ("a", "b", "c")]) == {
        "a": {"b": MASK}
    }
    assert dotted(("auth", "repos", 0, "pat")) == "auth.repos[0].pat" and dotted(()) == "(config)"


def test_the_start_check_message_is_one_line_naming_key_and_tenants() -> None:
    problems = [Unopenable(f"t{i}", "config", "x", key_id(K1)) for i in range(7)] + [
        Unopenable("t0", "tokens", "y", key_id(K1)),
        Unopenable("odd", "config", "corrupt"),
    ]
    message = describe_unopenable(problems, TokenCipher([K2]))
    assert message is not None and "\n" not in message
    assert f"key {key_id(K1)} is missing (SYNCKIT_SECRET_KEY holds {key_id(K2)})" in message
    assert "8 active tenants" in message and "t0, t1, t2, t3, t4 and 2 more" in message
    assert "tenant odd (config): corrupt" in message
    assert describe_unopenable([], TokenCipher([K2])) is None
    keyless = describe_unopenable(
        [
            Unopenable(
                "a", "tokens", "the stored tokens are encrypted but SYNCKIT_SECRET_KEY is not set"
            )
        ],
        TokenCipher([]),
    )
    assert keyless is not None and "SYNCKIT_SECRET_KEY is not set" in keyless


_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=8, max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    top=_text,
    nested=_text,
    listed=st.lists(_text, max_size=4),
    hooks=st.dictionaries(st.text(min_size=1, max_size=5), _text, max_size=3),
)
def test_no_generated_secret_survives_sealing_and_every_one_opens(
    top: str, nested: str, listed: list[str], hooks: dict[str, str]
) -> None:
    """Whatever the secrets' text (quotes, unicode, JSON-looking), the stored JSON holds
    none of them and opens to the same config."""
    config = {
        "api_key": top,
        "auth": {"user": "u", "pat": nested},
        "repos": [{"name": "r", "pat": p} for p in listed],
        "hooks": hooks,
    }
    cipher = TokenCipher([K1])
    stored = seal_config(VaultConfig, config, cipher)
    dumped = json.dumps(stored)
    for secret in [top, nested, *listed, *hooks.values()]:
        assert json.dumps(secret) not in dumped
    assert open_config(json.loads(dumped), cipher)[0] == config


def test_damage_is_corrupt_not_a_missing_key() -> None:
    """Garbage bytes, a seal its own (held) key does not open, a malformed key id and a
    config that is not an object raise SecretCorrupt: the row, not the keys."""
    cipher = TokenCipher([K1])
    sealed = cipher.seal(TokenSet(access_token="a"))
    tampered = sealed[:-8] + b"AAAAAAAA"
    for data in (b"\x00\xffgarbage", tampered, b"fernet:v2:zz!:" + sealed.split(b":", 3)[-1]):
        with pytest.raises(SecretCorrupt):
            cipher.open(data)
    with pytest.raises(SecretCorrupt, match="JSON list"):
        open_config([1, 2], cipher)
    with pytest.raises(SecretUnavailable):  # another key's seal: that key is missing
        TokenCipher([K2]).open(sealed)


def test_the_start_check_message_for_corrupt_rows_names_no_missing_key() -> None:
    """Only corrupt rows: the line says "corrupt" and that no key is missing."""
    message = describe_unopenable(
        [Unopenable("good2", "config", "the stored config is not JSON", corrupt=True)],
        TokenCipher([K1]),
    )
    assert message is not None
    assert "tenant good2 (config) is corrupt: the stored config is not JSON" in message
    assert "put the missing key" not in message
    assert "no key is missing: the row is damaged" in message

"""Secrets at rest: OAuth token sets, PKCE verifiers and secret config fields, sealed
with Fernet.

A :class:`TokenSet` is what a tenant's connection holds (access token, refresh token,
expiry). It never shows its secrets: its ``repr`` masks them, and it is not a ``dict``,
so it cannot be splatted into a log event by accident.

:class:`TokenCipher` is the one cipher for everything synckit keeps secret at rest. It
turns a token set into the bytes stored in ``connections.token_set`` and back, and one
secret config value into the JSON object stored in its place
(``{"$sealed": "<fernet token>", "$key": "<key id>"}``, see
:mod:`synckit.runtime.admin.tenants`). The key comes from ``$SYNCKIT_SECRET_KEY``: a Fernet
key, or several separated by commas to rotate keys (the first encrypts; every one of
them decrypts; ``synckit secrets rotate`` re-seals old rows under the first). Every
sealed value names its key by a short id (a hash of the key, never the key), so an
error can say which key is missing. Without a key, storing secrets is refused with a
:class:`ConfigurationError`, unless ``SYNCKIT_INSECURE_DEV_TOKENS=1`` is set for local
development: they are then stored in plaintext behind a recognisable marker, and a
warning says so each time.

The statements on ``connections.token_set`` are :mod:`synckit.store.connections`'; the
operations at the bottom seal and open around them (the ones that take no secret are
re-exported from there).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict, TypeVar

import structlog
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from synckit.errors.exceptions import (
    ConfigurationError,
    InsecureTokenStorageWarning,
    SecretCorrupt,
    SecretUnavailable,
)
from synckit.store import connections as connection_store
from synckit.store.db import Conn, Database

ENV_KEY = "SYNCKIT_SECRET_KEY"
ENV_INSECURE_DEV = "SYNCKIT_INSECURE_DEV_TOKENS"

#: Stored bytes start with one of these, so a reader knows what it holds. Version 2 is
#: followed by the key id and a colon, then the Fernet token; version 1 (no key id) is
#: still read, and re-sealed as version 2 by ``synckit secrets rotate``.
FERNET_MARKER = b"synckit:fernet:v2:"
FERNET_V1_MARKER = b"synckit:fernet:v1:"
PLAINTEXT_MARKER = b"synckit:INSECURE-PLAINTEXT:v1:"

#: The keys of the JSON object that stands for one sealed config value.
SEALED = "$sealed"
SEALED_KEY = "$key"
#: A secret config value kept in plaintext under ``SYNCKIT_INSECURE_DEV_TOKENS=1``.
INSECURE = "$insecure"

_MASK = "***"

log = structlog.get_logger("synckit.secrets")
_V = TypeVar("_V")


def _mask(secret: str | None) -> str | None:
    return None if secret is None else _MASK


#: The longest a token is taken to live, whatever the token endpoint says: a token that
#: claims centuries (or an expiry no clock can hold) is refreshed after a year.
MAX_TOKEN_LIFETIME = timedelta(days=365)


def token_lifetime(expires_in: Any, expires_at: Any, now: datetime) -> timedelta | None:
    """How long a token endpoint's answer says its token lives, within
    ``[0, MAX_TOKEN_LIFETIME]``; None when it says nothing readable (the token is then
    taken to be valid until a 401 says otherwise).

    ``expires_in`` (seconds, RFC 6749) wins over ``expires_at`` (a Unix time some
    providers send). Any value a server can send gives an answer, never an exception: an
    overflow here would lose a refresh the server already made (and the refresh token it
    may have rotated).
    """
    seconds = _number(expires_in)
    if seconds is None:
        at = _number(expires_at)
        if at is None:
            return None
        seconds = at - now.timestamp()
    return timedelta(seconds=min(max(seconds, 0.0), MAX_TOKEN_LIFETIME.total_seconds()))


def _number(value: Any) -> float | None:
    """A finite number from JSON's number or a numeric string, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class TokenSet:
    """A tenant's OAuth2 tokens. ``repr`` and ``str`` never show the tokens.

    ``access_token`` may be ``None`` when only a refresh token is known (``tenants reauth
    --refresh-token``): the first request then refreshes.
    """

    access_token: str | None = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    #: When the access token stops working (UTC), if the provider said.
    expires_at: datetime | None = None
    token_type: str = "Bearer"
    scope: str | None = None
    #: When the access token was issued (UTC): with ``expires_at``, its lifetime, which
    #: sets how early it is refreshed. ``None`` for tokens stored before synckit kept it.
    issued_at: datetime | None = None

    def __post_init__(self) -> None:
        if not self.access_token and not self.refresh_token:
            raise ValueError("a token set needs an access token or a refresh token")
        for moment in (self.expires_at, self.issued_at):
            if moment is not None and moment.tzinfo is None:
                raise ValueError("expires_at and issued_at must be timezone-aware")

    def __repr__(self) -> str:
        return (
            f"TokenSet(access_token={_mask(self.access_token)!r}, "
            f"refresh_token={_mask(self.refresh_token)!r}, expires_at={self.expires_at!r}, "
            f"token_type={self.token_type!r}, scope={self.scope!r}, issued_at={self.issued_at!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_token_response(
        cls,
        token: Mapping[str, Any],
        *,
        now: datetime,
        previous_refresh_token: str | None = None,
    ) -> TokenSet:
        """Build from a token endpoint response (RFC 6749 section 5.1).

        ``expires_in`` is counted from ``now``; a response without a refresh token keeps
        ``previous_refresh_token`` (providers that do not rotate omit it).
        Raises ``ValueError`` (without echoing the response) when it has no access token.
        """
        access = token.get("access_token")
        if not isinstance(access, str) or not access:
            raise ValueError("the token response has no access_token")
        refresh = token.get("refresh_token")
        if not isinstance(refresh, str) or not refresh:
            refresh = previous_refresh_token
        lifetime = token_lifetime(token.get("expires_in"), token.get("expires_at"), now)
        expires_at = None if lifetime is None else now + lifetime
        scope = token.get("scope")
        return cls(
            access_token=access,
            refresh_token=refresh,
            expires_at=expires_at,
            token_type=str(token.get("token_type") or "Bearer"),
            scope=scope if isinstance(scope, str) else None,
            issued_at=now,
        )

    def expires_within(self, leeway: timedelta, now: datetime) -> bool:
        """Whether the access token is expired, or will be within ``leeway`` of ``now``.

        A token without a known expiry is taken to be valid (a 401 will say otherwise).
        """
        return self.expires_at is not None and self.expires_at - leeway <= now

    @property
    def usable(self) -> bool:
        """Whether there is an access token to send at all."""
        return bool(self.access_token)

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value."""
        if not self.access_token:
            raise ValueError("no access token (only a refresh token is known)")
        # Providers answer "bearer" or "Bearer"; RFC 6750 servers must accept "Bearer".
        kind = "Bearer" if self.token_type.lower() == "bearer" else self.token_type
        return f"{kind} {self.access_token}"

    def to_json(self) -> dict[str, Any]:
        return {
            "access_token": self.access_token,
            "refresh_token": self.refresh_token,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "token_type": self.token_type,
            "scope": self.scope,
            "issued_at": self.issued_at.isoformat() if self.issued_at else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TokenSet:
        raw = data.get("expires_at")
        issued = data.get("issued_at")
        access = data.get("access_token")
        return cls(
            access_token=str(access) if access else None,
            refresh_token=data.get("refresh_token"),
            expires_at=datetime.fromisoformat(raw) if raw else None,
            token_type=str(data.get("token_type") or "Bearer"),
            scope=data.get("scope"),
            issued_at=datetime.fromisoformat(issued) if issued else None,
        )


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


_GENERATE = (
    "generate one with: synckit secrets keygen (or python -c 'from cryptography.fernet "
    "import Fernet; print(Fernet.generate_key().decode())')"
)
_NO_KEY = (
    f"refusing to store OAuth tokens unencrypted: set {ENV_KEY} to a Fernet key "
    f"({_GENERATE}), or set {ENV_INSECURE_DEV}=1 for local development only"
)
_NO_KEY_CONFIG = (
    f"refusing to store secret config fields unencrypted: set {ENV_KEY} to a Fernet key "
    f"({_GENERATE}), or set {ENV_INSECURE_DEV}=1 for local development only"
)


def key_id(key: str) -> str:
    """A short public name for a Fernet key: 8 hex digits of a hash of it.

    Stored beside what the key sealed, so a missing key can be named in an error without
    revealing anything about it."""
    return hashlib.sha256(b"synckit-key-id:" + key.strip().encode()).hexdigest()[:8]


#: What a key id looks like (:func:`key_id`): anything else in its place is damage.
_KEY_ID = re.compile(r"[0-9a-f]{8}")


def is_sealed_value(value: object) -> bool:
    """Whether ``value`` is the stored form of one secret config value."""
    return isinstance(value, Mapping) and (
        (SEALED in value and set(value) <= {SEALED, SEALED_KEY})
        or (INSECURE in value and set(value) == {INSECURE})
    )


class TokenCipher:
    """Seals secrets into what is stored at rest, and opens them again.

    ``keys`` are Fernet keys (urlsafe base64 of 32 bytes); the first encrypts, all
    decrypt. With no key, sealing raises :class:`ConfigurationError` unless
    ``insecure_dev`` is set. Error messages never include a key or a secret.
    """

    def __init__(self, keys: list[str] | None = None, *, insecure_dev: bool = False) -> None:
        self.insecure_dev = insecure_dev
        self._fernet: MultiFernet | None = None
        self._by_id: dict[str, Fernet] = {}
        self._primary = ""
        usable = [k.strip() for k in keys or [] if k.strip()]
        if usable:
            try:
                fernets = [Fernet(k.encode()) for k in usable]
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(
                    f"{ENV_KEY} is not a valid Fernet key (32 url-safe base64-encoded bytes); "
                    f"{_GENERATE}"
                ) from exc
            self._fernet = MultiFernet(fernets)
            for k, f in zip(usable, fernets, strict=True):
                self._by_id.setdefault(key_id(k), f)
            self._primary = key_id(usable[0])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TokenCipher:
        """The cipher configured by ``$SYNCKIT_SECRET_KEY`` and ``$SYNCKIT_INSECURE_DEV_TOKENS``."""
        env = os.environ if environ is None else environ
        raw = env.get(ENV_KEY) or ""
        return cls(raw.split(","), insecure_dev=_truthy(env.get(ENV_INSECURE_DEV)))

    @property
    def encrypts(self) -> bool:
        return self._fernet is not None

    @property
    def key_ids(self) -> list[str]:
        """The ids of the configured keys, the sealing one first."""
        return list(self._by_id)

    @property
    def primary_key_id(self) -> str | None:
        """The id of the key new seals use (``None`` without a key)."""
        return self._primary if self._fernet is not None else None

    def _warn_insecure(self, what: str) -> None:
        message = (
            f"storing {what} UNENCRYPTED because {ENV_INSECURE_DEV}=1; "
            f"never do this outside local development (set {ENV_KEY})"
        )
        warnings.warn(message, InsecureTokenStorageWarning, stacklevel=3)
        log.warning("secrets.insecure_dev_tokens", message=message)

    def _decrypt(self, token: bytes, kid: str | None, what: str) -> bytes:
        if self._fernet is None:
            raise SecretUnavailable(
                f"the stored {what} are encrypted but {ENV_KEY} is not set"
                + (f" (they were sealed with key {kid})" if kid else ""),
                key_id=kid,
            )
        try:
            if kid is not None and kid in self._by_id:
                return self._by_id[kid].decrypt(token)
            return self._fernet.decrypt(token)
        except InvalidToken:
            if kid is not None and kid in self._by_id:
                # Sealed with this very key (its id says so), yet it does not open.
                raise SecretCorrupt(
                    f"the stored {what} are corrupt: key {kid}, which {ENV_KEY} holds and "
                    "which sealed them, does not open them"
                ) from None
            held = ", ".join(self._by_id)
            sealed_with = f"key {kid}" if kid else "a key"
            raise SecretUnavailable(
                f"cannot decrypt the stored {what}: {ENV_KEY} does not hold the key they were "
                f"sealed with ({sealed_with}; it holds {held}); keep old keys after the new "
                "one, comma-separated, while rotating",
                key_id=kid,
            ) from None

    def seal(self, token_set: TokenSet) -> bytes:
        """The bytes to store for ``token_set``."""
        plain = json.dumps(token_set.to_json(), sort_keys=True).encode()
        if self._fernet is not None:
            return FERNET_MARKER + self._primary.encode() + b":" + self._fernet.encrypt(plain)
        if not self.insecure_dev:
            raise ConfigurationError(_NO_KEY)
        self._warn_insecure("OAuth tokens")
        return PLAINTEXT_MARKER + plain

    def open(self, data: bytes) -> TokenSet:
        """The token set stored as ``data``; :class:`ConfigurationError` if it cannot be read
        (:class:`SecretUnavailable` when the key is the problem)."""
        data = bytes(data)
        try:
            if data.startswith(FERNET_MARKER):
                kid, sep, token = data[len(FERNET_MARKER) :].partition(b":")
                if not sep or not _KEY_ID.fullmatch(kid.decode("ascii")):
                    raise ValueError("no key id")
                plain = self._decrypt(token, kid.decode("ascii"), "tokens")
                return TokenSet.from_json(json.loads(plain))
            if data.startswith(FERNET_V1_MARKER):
                plain = self._decrypt(data[len(FERNET_V1_MARKER) :], None, "tokens")
                return TokenSet.from_json(json.loads(plain))
            if data.startswith(PLAINTEXT_MARKER):
                if not self.insecure_dev:
                    raise ConfigurationError(
                        "the stored tokens are unencrypted development tokens; set "
                        f"{ENV_INSECURE_DEV}=1 to use them, or re-authorise the tenant "
                        f"with {ENV_KEY} set"
                    )
                return TokenSet.from_json(json.loads(data[len(PLAINTEXT_MARKER) :]))
        except (ValueError, KeyError, TypeError) as exc:
            # The message of a JSON error quotes the document: do not chain it.
            raise SecretCorrupt(f"the stored tokens are corrupt ({type(exc).__name__})") from None
        raise SecretCorrupt("the stored tokens are in an unknown format")

    def is_current(self, data: bytes) -> bool:
        """Whether ``data`` (a stored token set) is sealed under the sealing key already."""
        return self._fernet is not None and bytes(data).startswith(
            FERNET_MARKER + self._primary.encode() + b":"
        )

    def reseal(self, data: bytes) -> bytes | None:
        """``data`` (a stored token set) sealed under the sealing key, or ``None`` when it
        is so already; :class:`ConfigurationError` if it cannot be opened."""
        if not self.encrypts:
            raise ConfigurationError(f"re-sealing needs a key: set {ENV_KEY}")
        if self.is_current(data):
            return None
        return self.seal(self.open(data))

    def seal_value(self, value: Any) -> dict[str, Any]:
        """The JSON object stored in place of one secret config value (any JSON value)."""
        plain = json.dumps(value).encode()
        if self._fernet is not None:
            return {SEALED: self._fernet.encrypt(plain).decode("ascii"), SEALED_KEY: self._primary}
        if not self.insecure_dev:
            raise ConfigurationError(_NO_KEY_CONFIG)
        self._warn_insecure("secret config fields")
        return {INSECURE: value}

    def open_value(self, stored: Mapping[str, Any]) -> Any:
        """The value a :meth:`seal_value` object stands for."""
        if INSECURE in stored:
            if not self.insecure_dev:
                raise ConfigurationError(
                    "a secret config field is stored unencrypted (development); set "
                    f"{ENV_INSECURE_DEV}=1 to use it, or set {ENV_KEY} and run "
                    "`synckit secrets rotate`"
                )
            return stored[INSECURE]
        token, kid = stored.get(SEALED), stored.get(SEALED_KEY)
        if not isinstance(token, str) or not (
            kid is None or (isinstance(kid, str) and _KEY_ID.fullmatch(kid))
        ):
            raise SecretCorrupt("a sealed config field is corrupt")
        plain = self._decrypt(token.encode("ascii", "replace"), kid, "config secrets")
        try:
            return json.loads(plain)
        except ValueError:
            raise SecretCorrupt("a sealed config field is corrupt") from None

    def is_current_value(self, stored: Mapping[str, Any]) -> bool:
        """Whether a sealed config value is sealed under the sealing key already."""
        return (
            self._fernet is not None
            and SEALED in stored
            and stored.get(SEALED_KEY) == self._primary
        )


# --- token sets in the store ---------------------------------------------------------------
# The statements are synckit.store.connections'; these seal and open around them.


class _Stored(TypedDict):
    sealed: bytes
    expires_at: datetime | None


def _stored(cipher: TokenCipher, token_set: TokenSet) -> _Stored:
    """``token_set`` as a connection row stores it: sealed, its expiry beside it."""
    return {"sealed": cipher.seal(token_set), "expires_at": token_set.expires_at}


async def write_token_set(
    conn: Conn,
    tenant: str,
    token_set: TokenSet,
    *,
    cipher: TokenCipher,
    now: datetime,
    activate: bool = False,
) -> None:
    """Store ``token_set`` (sealed) for the tenant; ``activate`` also sets status active."""
    await connection_store.write_token_set(
        conn, tenant, **_stored(cipher, token_set), now=now, activate=activate
    )


async def save_refreshed_token_set(
    conn: Conn,
    tenant: str,
    token_set: TokenSet,
    *,
    owner: str,
    cipher: TokenCipher,
    now: datetime,
) -> bool:
    """Store the refreshed set and end the lease, only if ``owner`` still holds it."""
    return await connection_store.save_refreshed_token_set(
        conn, tenant, **_stored(cipher, token_set), owner=owner, now=now
    )


async def reseal_token_sets(
    db: Database, cipher: TokenCipher, *, page: int = 500
) -> tuple[int, tuple[tuple[str, str], ...]]:
    """Seal every stored token set under ``cipher``'s sealing key (key rotation).

    Returns how many were re-sealed, and the tenants whose tokens could not be opened
    (named, with the reason; left as they are). A page of rows at a time, in one short
    transaction holding their locks: a refresh that stores new tokens meanwhile waits
    for it, and is not overwritten. Idempotent.
    """
    return await reseal_in_pages(
        db,
        page,
        connection_store.token_sets_page,
        lambda r: cipher.reseal(r.token_set),
        connection_store.replace_token_set,
    )


async def reseal_in_pages(
    db: Database,
    page: int,
    read: Callable[..., Awaitable[Sequence[Any]]],
    reseal: Callable[[Any], _V | None],
    write: Callable[[Conn, str, _V], Awaitable[None]],
) -> tuple[int, tuple[tuple[str, str], ...]]:
    """Re-seal the ``connections`` rows ``read`` gives (``read(conn, after=, limit=)``: a
    page of rows with their ``tenant``, by tenant, locked), ``page`` rows to a short
    transaction: ``reseal`` gives a row's new value (None: nothing to do;
    :class:`ConfigurationError`: it cannot be opened), which ``write`` stores. How many
    were re-sealed, and the tenants that could not be (with the reason)."""
    resealed, failed = 0, []
    after = ""
    while True:
        async with db.begin() as conn:
            rows = await read(conn, after=after, limit=page)
            for r in rows:
                try:
                    new = reseal(r)
                except ConfigurationError as exc:
                    failed.append((r.tenant, str(exc)))
                    continue
                if new is not None:
                    await write(conn, r.tenant, new)
                    resealed += 1
        if len(rows) < page:
            return resealed, tuple(failed)
        after = rows[-1].tenant


__all__ = [
    "ENV_INSECURE_DEV",
    "ENV_KEY",
    "FERNET_MARKER",
    "FERNET_V1_MARKER",
    "INSECURE",
    "PLAINTEXT_MARKER",
    "SEALED",
    "SEALED_KEY",
    "TokenCipher",
    "TokenSet",
    "is_sealed_value",
    "key_id",
    "reseal_in_pages",
    "reseal_token_sets",
    "save_refreshed_token_set",
    "write_token_set",
]

"""What the configured keys can open: the worker's start check, and key rotation.

:func:`require_openable_secrets` runs before a worker claims anything: every active
tenant's token set and config must open with ``$SYNCKIT_SECRET_KEY``, or the worker
refuses to start with one line naming the missing key (by id) and the tenants, rather
than failing each of their cycles later. :func:`rotate_secrets` re-seals everything
sealed (token sets, config secrets, pending PKCE verifiers) under the first key, so the
old keys can then be dropped from the list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel

from synckit.clock import utcnow
from synckit.errors.exceptions import ConfigurationError, SecretCorrupt, SecretUnavailable
from synckit.runtime.credentials.config_secrets import open_config
from synckit.runtime.credentials.secrets import ENV_KEY, TokenCipher, reseal_token_sets
from synckit.store import connections as connection_store
from synckit.store.connections import UNREADABLE_ROW_REASON
from synckit.store.db import Database

if TYPE_CHECKING:
    from synckit.connectors.base import Connector

__all__ = [
    "RotateResult",
    "Unopenable",
    "describe_unopenable",
    "find_unopenable",
    "hold_unreadable",
    "models_of",
    "require_openable_secrets",
    "rotate_secrets",
]

_NAMES_SHOWN = 5
log = structlog.get_logger("synckit.keys")


@dataclass(frozen=True)
class Unopenable:
    """One tenant's secret that the keys cannot open: ``what`` is ``tokens`` or
    ``config``; ``key_id`` the key it was sealed with when that is the problem.
    ``corrupt``: the row is damaged, not the keys short (the keys open the other rows,
    or this one is not even in a form a key could open)."""

    tenant: str
    what: str
    reason: str
    key_id: str | None = None
    corrupt: bool = False
    #: A seal that names no key (the first format) did not open: a missing key, or damage.
    unnamed_seal: bool = False


async def find_unopenable(
    db: Database, cipher: TokenCipher, *, page: int = 1000
) -> list[Unopenable]:
    """Every active tenant's token set and config that ``cipher`` cannot open."""
    found: list[Unopenable] = []
    opened = 0
    after = ""
    while True:
        async with db.read() as conn:
            rows = await connection_store.active_secrets_page(conn, after=after, limit=page)
        for r in rows:
            problems, n = _check_row(r.tenant, r.token_set, r.config_text, cipher)
            found.extend(problems)
            opened += n
        if len(rows) < page:
            break
        after = rows[-1].tenant
    if opened:
        # A seal that names no key and does not open, while the keys open other rows:
        # this row is damaged, no key is missing.
        found = [replace(p, corrupt=True) if p.unnamed_seal else p for p in found]
    return found


def _try_open(
    tenant: str,
    what: str,
    open_it: Callable[[], int],
    cipher: TokenCipher,
    out: list[Unopenable],
) -> int:
    """How many sealed secrets ``open_it`` opened; what did not open is added to ``out``."""
    try:
        return open_it()
    except SecretUnavailable as exc:
        out.append(_unavailable(tenant, what, exc, cipher))
    except SecretCorrupt as exc:
        out.append(Unopenable(tenant, what, str(exc), corrupt=True))
    except ConfigurationError as exc:
        out.append(Unopenable(tenant, what, str(exc)))
    except (ValueError, RecursionError):
        if what != "config":  # only the config is parsed here
            raise
        out.append(Unopenable(tenant, what, "the stored config is not JSON", corrupt=True))
    return 0


def _check_row(
    tenant: str, token_set: bytes | None, config_text: str | None, cipher: TokenCipher
) -> tuple[list[Unopenable], int]:
    """What of the row does not open, and how many sealed secrets did."""
    import json

    out: list[Unopenable] = []
    opened = 0
    if token_set is not None:
        opened += _try_open(tenant, "tokens", lambda: (cipher.open(token_set), 1)[1], cipher, out)
    if config_text is not None:
        opened += _try_open(
            tenant, "config", lambda: len(open_config(json.loads(config_text), cipher)[1]),
            cipher, out,
        )  # fmt: skip
    return out, opened


def _unavailable(tenant: str, what: str, exc: SecretUnavailable, cipher: TokenCipher) -> Unopenable:
    # With a key set, a seal that names no key failed to decrypt (see TokenCipher._decrypt).
    unnamed = exc.key_id is None and cipher.encrypts
    return Unopenable(tenant, what, str(exc), exc.key_id, unnamed_seal=unnamed)


def _names(tenants: Sequence[str]) -> str:
    unique = sorted(set(tenants))
    shown = ", ".join(unique[:_NAMES_SHOWN])
    more = len(unique) - _NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def describe_unopenable(problems: Sequence[Unopenable], cipher: TokenCipher) -> str | None:
    """One line saying which keys are missing, which tenants cannot be opened and which
    rows are corrupt, or ``None`` when nothing is wrong. The hint to add a key is given
    only when a key is what is missing."""
    if not problems:
        return None
    tenants = {p.tenant for p in problems}
    held = (
        f"{ENV_KEY} holds {', '.join(cipher.key_ids)}"
        if cipher.encrypts
        else f"{ENV_KEY} is not set"
    )
    by_key: dict[str, list[str]] = {}
    other: list[Unopenable] = []
    corrupt: list[Unopenable] = []
    for p in problems:
        if p.corrupt:
            corrupt.append(p)
        elif p.key_id is not None:
            by_key.setdefault(p.key_id, []).append(p.tenant)
        else:
            other.append(p)
    parts: list[str] = []
    for kid, names in sorted(by_key.items()):
        parts.append(f"key {kid} is missing ({held}): tenants {_names(names)}")
    if other and not cipher.encrypts and all("not set" in p.reason for p in other):
        parts.append(f"{held}: tenants {_names([p.tenant for p in other])}")
    else:
        for p in sorted(other, key=lambda p: p.tenant)[:_NAMES_SHOWN]:
            parts.append(f"tenant {p.tenant} ({p.what}): {p.reason}")
        if len(other) > _NAMES_SHOWN:
            parts.append(f"and {len(other) - _NAMES_SHOWN} more")
    for p in sorted(corrupt, key=lambda p: p.tenant)[:_NAMES_SHOWN]:
        parts.append(f"tenant {p.tenant} ({p.what}) is corrupt: {p.reason}")
    if len(corrupt) > _NAMES_SHOWN:
        parts.append(f"and {len(corrupt) - _NAMES_SHOWN} more corrupt")
    n = len(tenants)
    hint = (
        f" (put the missing key in {ENV_KEY}, after the new one while rotating)"
        if by_key or other
        else (
            " (no key is missing: the row is damaged; a worker holds its tenant paused "
            "and runs the others)"
        )
    )
    return (
        f"cannot open the secrets of {n} active tenant{'s' if n != 1 else ''}: "
        + "; ".join(parts)
        + hint
    )


async def require_openable_secrets(
    db: Database, cipher: TokenCipher | None = None
) -> list[Unopenable]:
    """The worker's start check: raise :class:`~synckit.errors.exceptions.ConfigurationError` (one
    line, see :func:`describe_unopenable`) when a key is missing or unusable; hold the
    tenants whose rows are corrupt (:func:`hold_unreadable`) and return what was found
    in them, so that one damaged row costs only its tenant."""
    cipher = cipher or TokenCipher.from_env()
    problems = await find_unopenable(db, cipher)
    if any(not p.corrupt for p in problems):
        message = describe_unopenable(problems, cipher)
        assert message is not None
        raise ConfigurationError(" ".join(message.split()))
    for p in problems:
        await hold_unreadable(db, p.tenant, f"{p.what}: {p.reason}")
    return problems


async def hold_unreadable(db: Database, tenant: str, fault: str) -> bool:
    """Pause ``tenant`` (if active) because its connection row cannot be read: the reason
    names the fault (the ``unreadable_connection`` alert rule fires on it); ``True`` if
    this call paused it. Repair the row (``tenants remove`` and ``add``, or new tokens
    with ``tenants connect|reauth``), then ``tenants resume``."""
    reason = " ".join(f"{UNREADABLE_ROW_REASON} {fault}".split())
    async with db.begin() as conn:
        paused = await connection_store.pause_active(conn, [tenant], reason=reason, now=utcnow())
    if paused:
        log.warning("tenant.held_unreadable", tenant=tenant, reason=reason)
    return bool(paused)


@dataclass(frozen=True)
class RotateResult:
    """What :func:`rotate_secrets` re-sealed, and what it could not open (left as it was)."""

    key_id: str
    token_sets: int
    configs: int
    verifiers: int
    unreadable: tuple[tuple[str, str], ...] = ()
    #: Tenants whose connector's model was not given: their plaintext config secrets
    #: (rows from before sealing) could not be found.
    unchecked: int = 0

    @property
    def total(self) -> int:
        return self.token_sets + self.configs + self.verifiers


async def rotate_secrets(
    db: Database,
    cipher: TokenCipher,
    *,
    models: Mapping[str, type[BaseModel]] | None = None,
) -> RotateResult:
    """Re-seal every token set, config secret and pending PKCE verifier under
    ``cipher``'s sealing key (its first); idempotent.

    ``cipher`` must hold the old keys too; with ``insecure_dev`` it also seals what was
    stored in plaintext for development. ``models`` (connector name to config model)
    lets it seal plaintext config secrets of rows written before configs were sealed.
    """
    from synckit.runtime.admin.tenants import reseal_configs
    from synckit.runtime.credentials.authorize import reseal_verifiers

    if not cipher.encrypts or cipher.primary_key_id is None:
        raise ConfigurationError(f"rotating secrets needs a key: set {ENV_KEY}")
    tokens, token_failures = await reseal_token_sets(db, cipher)
    configs = await reseal_configs(db, cipher, models=models)
    verifiers = await reseal_verifiers(db, cipher)
    if not db.is_postgres:
        await connection_store.compact_sqlite(db)
    failures: list[tuple[str, str]] = [
        *((t, f"tokens: {r}") for t, r in token_failures),
        *((t, f"config: {r}") for t, r in configs.unreadable),
    ]
    return RotateResult(
        key_id=cipher.primary_key_id,
        token_sets=tokens,
        configs=configs.resealed,
        verifiers=verifiers,
        unreadable=tuple(sorted(failures)),
        unchecked=configs.unchecked,
    )


def models_of(connectors: Mapping[str, type[Connector[Any]]]) -> dict[str, type[BaseModel]]:
    """Connector name to config model, for the connectors an App knows
    (``models_of(app.connectors)``)."""
    return {name: cls.config_model for name, cls in connectors.items()}

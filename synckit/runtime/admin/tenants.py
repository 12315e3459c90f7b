"""Tenants: a customer's connection to one connector's API, in ``connections``.

A tenant has a config (validated by the connector's ``config_model`` when it is added),
a poll schedule, a resource key (its breaker, pacing and in-flight limit; default
``<connector>:<tenant>``) under a parent key (the per-API breaker; default
``api:<connector>``), and a status: ``active``, ``paused`` (its jobs are not claimed, its
cycles not scheduled) or ``needs_reauth`` (set by the runtime when credentials are
refused).

A config's secrets (the values its model types as ``SecretStr`` and the like, at any
depth) are sealed at rest with the cipher of token sets (``$SYNCKIT_SECRET_KEY``, see
:mod:`synckit.runtime.credentials.config_secrets`): the stored JSON holds
``{"$sealed": ..., "$key": ...}`` in their place, and reading opens them. Rows written
before that still read, their secrets in plaintext until the next write or ``synckit
secrets rotate``.

The statements are :mod:`synckit.store.connections`'; this module validates, seals and
reads rows into :class:`Tenant`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Secret, SecretBytes, SecretStr

from synckit.clock import utcnow
from synckit.connectors.schedule import DEFAULT_SCHEDULE, parse_schedule
from synckit.errors.exceptions import (
    ConfigurationError,
    ConnectionExists,
    SecretCorrupt,
    TenantError,
    TenantNotFound,
)
from synckit.runtime.credentials.config_secrets import (
    ConfigPath,
    mask_config,
    open_config,
    reseal_config,
    seal_config,
    secret_paths,
)
from synckit.runtime.credentials.secrets import TokenCipher, reseal_in_pages
from synckit.store import connections as connection_store
from synckit.store.checkpoints import delete_checkpoints
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.store.resources import configure_pacing, read_moments
from synckit.store.ticks import delete_poll_ticks

# Named in annotations only: connectors.base brings httpx, which `synckit tenants ls`
# does not need.
if TYPE_CHECKING:
    from synckit.connectors.base import Connector

__all__ = [
    "ResealResult",
    "Tenant",
    "add_tenant",
    "get_tenant",
    "list_tenants",
    "opened_config",
    "pause_tenant",
    "remove_tenant",
    "reseal_configs",
    "resume_tenant",
    "set_config",
    "shown_config",
    "unknown_fields",
    "update_tenant",
]

#: The columns a tenant is read from (the store's; named here for the readers that
#: parse rows with :func:`_tenant` too).
_COLUMNS = connection_store.TENANT_COLUMNS

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+\-]{0,99}", re.ASCII)
_MAX_SCHEDULE = 100


class ConnectorSource(Protocol):
    """Anything that names connector classes (an :class:`~synckit.app.App`)."""

    def connector(self, name: str) -> type[Connector[Any]]: ...


@dataclass(frozen=True)
class Tenant:
    """One row of ``connections``, without its tokens.

    ``config`` has its secrets opened (the values the connector gets), or ``***`` in their
    place when read with ``reveal=False``; ``secret_paths`` says where they are (the
    values stored sealed). ``config_error`` says why a config could not be read (only
    with ``reveal=False``: otherwise that raises). ``unreadable`` names what else a
    corrupt row holds, as ``(column, reason)``: a ``status`` the runtime does not write
    (kept as stored), a timestamp that is not one (None).
    """

    tenant: str
    connector: str
    resource_key: str
    config: dict[str, Any]
    schedule: str
    status: str
    status_reason: str | None
    created_at: datetime | None
    updated_at: datetime | None
    has_tokens: bool = False
    secret_paths: tuple[ConfigPath, ...] = ()
    config_error: str | None = None
    unreadable: tuple[tuple[str, str], ...] = ()


def check_tenant_name(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise ConfigurationError(
            f"tenant name {tenant!r}: use letters, digits and . _ @ + - "
            "(at most 100, starting with a letter or digit)"
        )
    return tenant


#: The longest resource key the tables hold (``resources.resource_key``).
MAX_RESOURCE_KEY = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_resource_keys(resource_key: str, parent_key: str) -> None:
    """A tenant's resource and parent keys as the tables can hold and every view can
    print: text of 1 to 200 characters without control characters (PostgreSQL's text
    cannot hold a NUL: one such key would fail a whole bulk import), and not the same."""
    for what, key in (("resource key", resource_key), ("parent key", parent_key)):
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"{what} must be non-empty text")
        if len(key) > MAX_RESOURCE_KEY:
            raise ConfigurationError(f"{what} is longer than {MAX_RESOURCE_KEY} characters")
        if _CONTROL.search(key):
            raise ConfigurationError(f"{what} {key!r} holds a control character")
    if resource_key == parent_key:
        raise ConfigurationError("a tenant's resource key cannot be its own parent key")


def _resolve(
    connector: str | type[Connector[Any]], app: ConnectorSource | None
) -> type[Connector[Any]]:
    if isinstance(connector, str):
        if app is None:
            raise ConfigurationError(
                f"connector {connector!r} given by name: pass the App that knows it (app=...)"
            )
        return app.connector(connector)
    if not connector.name:
        raise ConfigurationError(f"connector class {connector.__qualname__} has no name")
    return connector


def _check_schedule(schedule: str) -> str:
    if len(schedule) > _MAX_SCHEDULE:
        raise ConfigurationError(f"schedule is longer than {_MAX_SCHEDULE} characters")
    return parse_schedule(schedule).text


def unknown_fields(model: type[BaseModel], config: Mapping[str, Any]) -> list[str]:
    """The keys of ``config`` that ``model`` does not declare (by name or alias), unless
    the model takes extra fields (``extra="allow"``)."""
    if model.model_config.get("extra") == "allow":
        return []
    known: set[str] = set()
    for name, f in model.model_fields.items():
        known.add(name)
        for alias in (f.alias, f.validation_alias):
            if isinstance(alias, str):
                known.add(alias)
    return sorted(str(k) for k in config if k not in known)


def _plain_config(
    cls: type[Connector[Any]], tenant: str, config: Any, cipher: TokenCipher | None = None
) -> dict[str, Any]:
    """Validate ``config`` and return it as stored: the given keys, JSON-serialisable,
    its secrets sealed (``cipher``, default ``$SYNCKIT_SECRET_KEY``).

    What the user gave is stored rather than the model's dump, so that secrets typed as
    ``SecretStr`` survive, and defaults that change in a later release apply. A key the
    model does not know (a misspelt field) is refused by name, unless the model allows
    extra fields: pydantic's default would drop it silently. A config with secrets and
    no key to seal them is refused (:class:`ConfigurationError`), as token sets are.
    """
    if isinstance(config, Mapping):
        unknown = unknown_fields(cls.config_model, config)
        if unknown:
            known = ", ".join(sorted(cls.config_model.model_fields)) or "none"
            raise ConfigurationError(
                f"config of tenant {tenant!r}: unknown field{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(u) for u in unknown)} for connector {cls.name!r} "
                f"(its fields: {known})"
            )
    cls.validate_config(config, tenant=tenant)
    try:
        if isinstance(config, BaseModel):
            # A model's JSON dump masks secrets; reveal them, then make the rest JSON.
            plain: dict[str, Any] = json.loads(
                json.dumps(_reveal(config.model_dump()), default=str)
            )
        else:
            plain = dict(config or {})
        json.dumps(plain, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigurationError(
            f"config of tenant {tenant!r} cannot be stored as JSON: {exc}"
        ) from None
    where = _nul_at(plain)
    if where is not None:
        # PostgreSQL's jsonb cannot hold one (SQLite would): refused on both engines, by
        # name, not as a database error that fails a whole bulk import.
        raise ConfigurationError(
            f"config of tenant {tenant!r}: {where} holds a NUL character, "
            "which the database cannot store"
        )
    if not secret_paths(cls.config_model, plain):
        return plain
    try:
        return seal_config(cls.config_model, plain, cipher or TokenCipher.from_env())
    except ConfigurationError as exc:
        raise ConfigurationError(f"config of tenant {tenant!r}: {exc}") from None


def _nul_at(value: Any, path: str = "") -> str | None:
    """Where in a JSON value a string (a key or a value) holds a NUL character."""
    if isinstance(value, str):
        return (path or "the config") if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return f"a key of {path or 'the config'}"
            found = _nul_at(item, here)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _nul_at(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _reveal(value: Any) -> Any:
    if isinstance(value, SecretStr | SecretBytes | Secret):
        secret = value.get_secret_value()
        return secret.decode() if isinstance(secret, bytes) else secret
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_reveal(v) for v in value]
    return value


def _stored_config(text: str | None) -> object:
    # Read as text and parsed here: a row whose config is not JSON must be named, not
    # fail the whole query in the driver's result processing.
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise SecretCorrupt("the stored config is not JSON") from None


def opened_config(
    tenant: str, config_text: str | None, cipher: TokenCipher | None = None
) -> dict[str, Any]:
    """A tenant's stored config (its JSON text) with its secrets opened; a config that
    cannot be opened raises :class:`ConfigurationError` naming the tenant and field."""
    try:
        config, _ = open_config(_stored_config(config_text), cipher, reveal=True)
    except ConfigurationError as exc:
        kind = SecretCorrupt if isinstance(exc, SecretCorrupt) else ConfigurationError
        raise kind(f"tenant {tenant!r}: {exc}") from None
    return config


def _tenant(r: Any, *, reveal: bool, cipher: TokenCipher | None) -> Tenant:
    error: str | None = None
    try:
        config, paths = open_config(_stored_config(r.config_text), cipher, reveal=reveal)
    except ConfigurationError as exc:
        if reveal:
            # SecretCorrupt stays itself: the row, not the keys, is the problem.
            kind = SecretCorrupt if isinstance(exc, SecretCorrupt) else ConfigurationError
            raise kind(f"tenant {r.tenant!r}: {exc}") from None
        config, paths, error = {}, [], str(exc)
    moments, bad = read_moments(r._mapping, ("created_at", "updated_at"))
    if r.status not in connection_store.CONNECTION_STATUSES:
        bad = (("status", f"unknown status {str(r.status)[:60]!r}"), *bad)
    return Tenant(
        tenant=r.tenant,
        connector=r.connector,
        resource_key=r.resource_key,
        config=config,
        schedule=r.schedule or DEFAULT_SCHEDULE,
        status=r.status,
        status_reason=r.status_reason,
        created_at=moments["created_at"],
        updated_at=moments["updated_at"],
        has_tokens=bool(r.has_tokens),
        secret_paths=tuple(paths),
        config_error=error,
        unreadable=bad,
    )


def shown_config(t: Tenant, model: type[BaseModel] | None = None) -> dict[str, Any]:
    """The tenant's config as it may be shown: every secret ``***``.

    Secrets are found by type: the values stored sealed, and, with the connector's
    ``model``, every value it types as a secret (rows written before configs were sealed);
    what is left passes the redaction step (secret-looking names and texts).
    """
    from synckit.runtime.observe.logging import redact

    paths = list(t.secret_paths)
    if model is not None:
        paths += secret_paths(model, t.config)
    shown: dict[str, Any] = redact(mask_config(t.config, paths))
    return shown


async def add_tenant(
    db: Database,
    tenant: str,
    connector: str | type[Connector[Any]],
    config: Mapping[str, Any] | Any = None,
    *,
    schedule: str = DEFAULT_SCHEDULE,
    resource_key: str | None = None,
    parent_key: str | None = None,
    app: ConnectorSource | None = None,
) -> Tenant:
    """Add a tenant of ``connector`` (a class, or a name the ``app`` knows).

    ``config`` is validated by the connector's ``config_model``: an invalid one raises a
    one-line :class:`~synckit.errors.exceptions.ConfigurationError` naming the fields. ``schedule``
    is ``every <n><s|m|h|d>`` or a cron expression. The tenant's resource is created
    with the connector's ``max_in_flight`` and ``rate_limit``. A tenant that exists
    already is refused (:class:`TenantError`).
    """
    check_tenant_name(tenant)
    cls = _resolve(connector, app)
    schedule = _check_schedule(schedule)
    plain = _plain_config(cls, tenant, config)
    resource_key = resource_key or f"{cls.name}:{tenant}"
    parent_key = parent_key or f"api:{cls.name}"
    check_resource_keys(resource_key, parent_key)
    now = db.clock()
    try:
        async with db.begin() as conn:
            existing = await connection_store.connector_of(conn, tenant)
            if existing is not None:
                raise TenantError(f"tenant {tenant!r} exists already (connector {existing!r})")
            rate = cls.rate_limit
            await configure_pacing(
                conn,
                resource_key,
                parent_key=parent_key,
                max_in_flight=cls.max_in_flight,
                rate=rate.per_second if rate else None,
                burst=rate.burst if rate else None,
                now=now,
            )
            await connection_store.insert_connection(
                conn,
                tenant=tenant,
                connector=cls.name,
                resource_key=resource_key,
                config=plain,
                schedule=schedule,
                now=now,
            )
    except ConnectionExists as exc:  # a concurrent add of the same tenant
        raise TenantError(f"tenant {tenant!r} exists already") from exc
    return await get_tenant(db, tenant)


async def get_tenant(
    db: Database, tenant: str, *, reveal: bool = True, cipher: TokenCipher | None = None
) -> Tenant:
    """The tenant, or :class:`TenantNotFound`.

    Its config's secrets are opened with ``cipher`` (default ``$SYNCKIT_SECRET_KEY``): a
    config that cannot be opened or read raises :class:`ConfigurationError` naming the
    tenant and the field. With ``reveal=False`` they are ``***`` and no key is needed.
    """
    async with db.read() as conn:
        row = await connection_store.read_tenant_row(conn, tenant)
    if row is None:
        raise TenantNotFound(f"no tenant {tenant!r}")
    return _tenant(row, reveal=reveal, cipher=cipher)


async def list_tenants(
    db: Database,
    *,
    connector: str | None = None,
    status: str | None = None,
    reveal: bool = True,
    cipher: TokenCipher | None = None,
) -> list[Tenant]:
    """Tenants by name, optionally of one connector and/or in one status (``reveal``
    and ``cipher`` as for :func:`get_tenant`)."""
    if reveal and cipher is None:
        cipher = TokenCipher.from_env()
    async with db.read() as conn:
        rows = await connection_store.tenant_rows(conn, connector=connector, status=status)
        return [_tenant(r, reveal=reveal, cipher=cipher) for r in rows]


async def update_tenant(
    db: Database,
    tenant: str,
    *,
    config: Mapping[str, Any] | None = None,
    schedule: str | None = None,
    app: ConnectorSource | None = None,
    connector: type[Connector[Any]] | None = None,
) -> Tenant:
    """Replace the tenant's config (validated as in :func:`add_tenant`) and/or schedule.

    A new config is new credentials for a connector whose credentials live in its
    config (a static API key): a tenant in ``needs_reauth`` becomes active again, and
    its waiting jobs are claimed at once.
    """
    current = await get_tenant(db, tenant)
    plain: dict[str, Any] | None = None
    resumes = False
    if config is not None:
        cls = connector or _resolve(current.connector, app)
        plain = _plain_config(cls, tenant, config)
        resumes = current.status == "needs_reauth"
    checked = _check_schedule(schedule) if schedule is not None else None
    async with db.begin() as conn:
        await connection_store.update_connection(
            conn, tenant, now=utcnow(), config=plain, schedule=checked, reactivate=resumes
        )
        if resumes:
            await connection_store.notify_workers(conn)
    if resumes:
        enqueueing.target_wake(db)
    return await get_tenant(db, tenant)


async def set_config(
    db: Database,
    tenant: str,
    changes: Mapping[str, Any],
    *,
    app: ConnectorSource | None = None,
    connector: type[Connector[Any]] | None = None,
) -> Tenant:
    """Change some fields of the tenant's config (the others kept), validated as a whole.

    Resumes a tenant in ``needs_reauth`` (see :func:`update_tenant`).
    """
    if not changes:
        raise ConfigurationError("no config field to set")
    current = await get_tenant(db, tenant)
    return await update_tenant(
        db, tenant, config={**current.config, **changes}, app=app, connector=connector
    )


async def pause_tenant(db: Database, tenant: str, reason: str = "paused by operator") -> Tenant:
    """Stop the tenant's work: its jobs are not claimed and no cycle is scheduled.

    A cycle already running finishes its current page. Needs no key: the tenant is
    returned with its secret config fields masked (``reveal=False``).
    """
    await get_tenant(db, tenant, reveal=False)
    async with db.begin() as conn:
        await connection_store.set_status(conn, tenant, "paused", reason=reason, now=utcnow())
    return await get_tenant(db, tenant, reveal=False)


async def resume_tenant(db: Database, tenant: str) -> Tenant:
    """Make a paused tenant active again; its overdue cycles are scheduled at once.

    A tenant that needs re-authorisation is refused: new credentials resume it
    (``tenants connect``/``reauth`` for OAuth, ``tenants set-config`` for a key in its
    config). Needs no key: the tenant is returned with its secret config fields masked.
    """
    current = await get_tenant(db, tenant, reveal=False)
    if current.status == "needs_reauth":
        raise TenantError(
            f"tenant {tenant!r} needs re-authorisation ({current.status_reason or 'no reason'}); "
            "store new credentials to resume it: `synckit tenants connect|reauth` (OAuth) "
            "or `synckit tenants set-config` (credentials in its config)"
        )
    async with db.begin() as conn:
        await connection_store.set_status(conn, tenant, "active", reason=None, now=utcnow())
    return await get_tenant(db, tenant, reveal=False)


async def remove_tenant(db: Database, tenant: str) -> Tenant:
    """Delete the tenant, its checkpoints and schedule ticks.

    Its dead letters and audit counts stay (they are history); queued cycles of the
    tenant find it gone and discard themselves.
    """
    current = await get_tenant(db, tenant)
    async with db.begin() as conn:
        await delete_checkpoints(conn, tenant)
        await delete_poll_ticks(conn, tenant)
        await connection_store.delete_connection(conn, tenant)
    return current


async def dead_letter_counts(db: Database, tenant: str) -> dict[str, int]:
    """The tenant's dead letters by status."""
    async with db.read() as conn:
        return await connection_store.tenant_dead_letter_counts(conn, tenant)


@dataclass(frozen=True)
class ResealResult:
    """What :func:`reseal_configs` did: configs re-sealed, and the tenants whose config
    could not be read (named, with the reason) and were left as they are."""

    resealed: int
    unreadable: tuple[tuple[str, str], ...] = ()
    #: Tenants of connectors without a model given: sealed values were re-sealed, but
    #: plaintext secrets (rows older than sealing) could not be found.
    unchecked: int = 0


async def reseal_configs(
    db: Database,
    cipher: TokenCipher,
    *,
    models: Mapping[str, type[BaseModel]] | None = None,
    page: int = 500,
) -> ResealResult:
    """Seal every tenant's config secrets under ``cipher``'s sealing key (key rotation).

    ``models`` maps connector names to config models: their tenants' plaintext secrets
    are sealed as well. Rows are read and written a page at a time, each page in one
    short transaction holding its rows' locks, so a concurrent config change is neither
    lost nor overwritten; ``updated_at`` is left alone (nothing the operator set
    changed). Idempotent: a second run re-seals nothing.
    """
    if not cipher.encrypts:
        raise ConfigurationError("rotating secrets needs a key: set SYNCKIT_SECRET_KEY")
    models = models or {}
    unchecked = 0

    def resealed_config(r: Any) -> dict[str, Any] | None:
        nonlocal unchecked
        model = models.get(r.connector)
        unchecked += model is None
        stored = _stored_config(r.config_text)
        if stored is None:
            return None
        if not isinstance(stored, Mapping):
            raise ConfigurationError("the stored config is not a JSON object")
        return reseal_config(stored, cipher, model)

    resealed, unreadable = await reseal_in_pages(
        db, page, connection_store.configs_page, resealed_config, connection_store.replace_config
    )
    return ResealResult(resealed, unreadable, unchecked)

"""Tenants: a customer's connection to one connector's API, in ``connections``.

A tenant has a config (validated by the connector's ``config_model`` when it is added),
a poll schedule, a resource key (its breaker, pacing and in-flight limit; default
``<connector>:<tenant>``) under a parent key (the per-API breaker; default
``api:<connector>``), and a status: ``active``, ``paused`` (its jobs are not claimed, its
cycles not scheduled) or ``needs_reauth`` (set by the runtime when credentials are
refused).

Every SQL statement on ``connections`` that is not about tokens lives here, named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, SecretBytes, SecretStr
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError

from synckit.connectors.base import Connector
from synckit.connectors.schedule import DEFAULT_SCHEDULE, parse_schedule
from synckit.errors.exceptions import ConfigurationError, SynckitError
from synckit.runtime import jobs as job_store
from synckit.runtime import pacing
from synckit.runtime.db import Database
from synckit.runtime.jobs import utcnow
from synckit.runtime.poll import delete_checkpoints, delete_poll_ticks
from synckit.runtime.schema import connections, dead_letters

__all__ = [
    "Tenant",
    "TenantError",
    "TenantNotFound",
    "add_tenant",
    "get_tenant",
    "list_tenants",
    "pause_tenant",
    "remove_tenant",
    "resume_tenant",
    "set_config",
    "unknown_fields",
    "update_tenant",
]

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+\-]{0,99}", re.ASCII)
_MAX_SCHEDULE = 100


class TenantError(SynckitError):
    """A tenant operation was refused (it exists already, it is not paused, ...)."""


class TenantNotFound(TenantError):
    """No tenant has the given name."""


class ConnectorSource(Protocol):
    """Anything that names connector classes (an :class:`~synckit.app.App`)."""

    def connector(self, name: str) -> type[Connector[Any]]: ...


@dataclass(frozen=True)
class Tenant:
    """One row of ``connections``, without its tokens. ``config`` is as stored (unmasked)."""

    tenant: str
    connector: str
    resource_key: str
    config: dict[str, Any]
    schedule: str
    status: str
    status_reason: str | None
    created_at: datetime
    updated_at: datetime
    has_tokens: bool = False


def check_tenant_name(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise ConfigurationError(
            f"tenant name {tenant!r}: use letters, digits and . _ @ + - "
            "(at most 100, starting with a letter or digit)"
        )
    return tenant


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


def _plain_config(cls: type[Connector[Any]], tenant: str, config: Any) -> dict[str, Any]:
    """Validate ``config`` and return it as stored: the given keys, JSON-serialisable.

    What the user gave is stored rather than the model's dump, so that secrets typed as
    ``SecretStr`` survive, and defaults that change in a later release apply. A key the
    model does not know (a misspelt field) is refused by name, unless the model allows
    extra fields: pydantic's default would drop it silently.
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
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"config of tenant {tenant!r} cannot be stored as JSON: {exc}"
        ) from None
    return plain


def _reveal(value: Any) -> Any:
    if isinstance(value, SecretStr | SecretBytes):
        secret = value.get_secret_value()
        return secret.decode() if isinstance(secret, bytes) else secret
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_reveal(v) for v in value]
    return value


def _tenant(r: Any) -> Tenant:
    return Tenant(
        tenant=r.tenant,
        connector=r.connector,
        resource_key=r.resource_key,
        config=dict(r.config or {}),
        schedule=r.schedule or DEFAULT_SCHEDULE,
        status=r.status,
        status_reason=r.status_reason,
        created_at=r.created_at,
        updated_at=r.updated_at,
        has_tokens=bool(r.has_tokens),
    )


_COLUMNS = (
    connections.c.tenant,
    connections.c.connector,
    connections.c.resource_key,
    connections.c.config,
    connections.c.schedule,
    connections.c.status,
    connections.c.status_reason,
    connections.c.created_at,
    connections.c.updated_at,
    connections.c.token_set.is_not(None).label("has_tokens"),
)


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
    one-line :class:`~synckit.errors.ConfigurationError` naming the fields. ``schedule``
    is ``every <n><s|m|h|d>`` or a cron expression. The tenant's resource is created
    with the connector's ``max_in_flight`` and ``rate_limit``. A tenant that exists
    already is refused (:class:`TenantError`).
    """
    check_tenant_name(tenant)
    cls = _resolve(connector, app)
    plain = _plain_config(cls, tenant, config)
    schedule = _check_schedule(schedule)
    resource_key = resource_key or f"{cls.name}:{tenant}"
    parent_key = parent_key or f"api:{cls.name}"
    if resource_key == parent_key:
        raise ConfigurationError("a tenant's resource key cannot be its own parent key")
    now = utcnow()
    try:
        async with db.begin() as conn:
            existing = (
                await conn.execute(
                    select(connections.c.connector).where(connections.c.tenant == tenant)
                )
            ).first()
            if existing is not None:
                raise TenantError(
                    f"tenant {tenant!r} exists already (connector {existing.connector!r})"
                )
            rate = cls.rate_limit
            await pacing.configure_pacing(
                conn,
                resource_key,
                parent_key=parent_key,
                max_in_flight=cls.max_in_flight,
                rate=rate.per_second if rate else None,
                burst=rate.burst if rate else None,
                now=now,
            )
            await conn.execute(
                connections.insert().values(
                    tenant=tenant,
                    connector=cls.name,
                    resource_key=resource_key,
                    config=plain,
                    schedule=schedule,
                    status="active",
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError as exc:  # a concurrent add of the same tenant
        raise TenantError(f"tenant {tenant!r} exists already") from exc
    return await get_tenant(db, tenant)


async def get_tenant(db: Database, tenant: str) -> Tenant:
    """The tenant, or :class:`TenantNotFound`."""
    async with db.begin() as conn:
        row = (await conn.execute(select(*_COLUMNS).where(connections.c.tenant == tenant))).first()
    if row is None:
        raise TenantNotFound(f"no tenant {tenant!r}")
    return _tenant(row)


async def list_tenants(
    db: Database, *, connector: str | None = None, status: str | None = None
) -> list[Tenant]:
    """Tenants by name, optionally of one connector and/or in one status."""
    stmt = select(*_COLUMNS).order_by(connections.c.tenant)
    if connector:
        stmt = stmt.where(connections.c.connector == connector)
    if status:
        stmt = stmt.where(connections.c.status == status)
    async with db.begin() as conn:
        return [_tenant(r) for r in await conn.execute(stmt)]


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
    values: dict[str, Any] = {"updated_at": utcnow()}
    resumes = False
    if config is not None:
        cls = connector or _resolve(current.connector, app)
        values["config"] = _plain_config(cls, tenant, config)
        resumes = current.status == "needs_reauth"
        if resumes:
            values.update(status="active", status_reason=None)
    if schedule is not None:
        values["schedule"] = _check_schedule(schedule)
    async with db.begin() as conn:
        await conn.execute(
            update(connections).where(connections.c.tenant == tenant).values(**values)
        )
        if resumes and db.is_postgres:
            await conn.exec_driver_sql(f"NOTIFY {job_store.NOTIFY_CHANNEL}")
    if resumes:
        job_store.target_wake(db)
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

    A cycle already running finishes its current page.
    """
    await get_tenant(db, tenant)
    async with db.begin() as conn:
        await conn.execute(
            update(connections)
            .where(connections.c.tenant == tenant)
            .values(status="paused", status_reason=reason[:500], updated_at=utcnow())
        )
    return await get_tenant(db, tenant)


async def resume_tenant(db: Database, tenant: str) -> Tenant:
    """Make a paused tenant active again; its overdue cycles are scheduled at once.

    A tenant that needs re-authorisation is refused: new credentials resume it
    (``tenants connect``/``reauth`` for OAuth, ``tenants set-config`` for a key in its
    config).
    """
    current = await get_tenant(db, tenant)
    if current.status == "needs_reauth":
        raise TenantError(
            f"tenant {tenant!r} needs re-authorisation ({current.status_reason or 'no reason'}); "
            "store new credentials to resume it: `synckit tenants connect|reauth` (OAuth) "
            "or `synckit tenants set-config` (credentials in its config)"
        )
    async with db.begin() as conn:
        await conn.execute(
            update(connections)
            .where(connections.c.tenant == tenant)
            .values(status="active", status_reason=None, updated_at=utcnow())
        )
    return await get_tenant(db, tenant)


async def remove_tenant(db: Database, tenant: str) -> Tenant:
    """Delete the tenant, its checkpoints and schedule ticks.

    Its dead letters and audit counts stay (they are history); queued cycles of the
    tenant find it gone and discard themselves.
    """
    current = await get_tenant(db, tenant)
    async with db.begin() as conn:
        await delete_checkpoints(conn, tenant)
        await delete_poll_ticks(conn, tenant)
        await conn.execute(delete(connections).where(connections.c.tenant == tenant))
    return current


async def dead_letter_counts(db: Database, tenant: str) -> dict[str, int]:
    """The tenant's dead letters by status."""
    async with db.begin() as conn:
        rows = await conn.execute(
            select(dead_letters.c.status, func.count())
            .where(dead_letters.c.tenant == tenant)
            .group_by(dead_letters.c.status)
        )
        return {status: count for status, count in rows}

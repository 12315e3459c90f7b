"""Every statement on the tenants' ``connections`` rows and on ``pending_authorizations``.

The runtime's tenants, token sets, refresh leases, connect flow and key rotation
(:mod:`synckit.runtime.admin.tenants`, :mod:`~synckit.runtime.credentials.secrets`,
:mod:`~synckit.runtime.credentials.oauth`, :mod:`~synckit.runtime.credentials.authorize`,
:mod:`~synckit.runtime.credentials.keys`, :mod:`~synckit.runtime.admin.bulk`) call these
named operations and build no SQL themselves. Secrets arrive here sealed (bytes, or the
sealed JSON of a config): the store never sees a key or a plaintext token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Text, and_, bindparam, cast, delete, func, literal, select, text, update
from sqlalchemy.exc import IntegrityError

from synckit.errors.exceptions import ConnectionExists, ConnectionNotFound
from synckit.redaction import redact_text
from synckit.store import resources as resources_store
from synckit.store.db import Conn, Database, SyncConn
from synckit.store.leases import Lease, LeaseColumns, claim, fenced
from synckit.store.moments import guarded_moment, storable_text
from synckit.store.notify import NOTIFY_CHANNEL
from synckit.store.resources import readable
from synckit.store.row_arrays import list_param, rows_params, rows_source
from synckit.store.tables import checkpoints, connections, dead_letters, pending_authorizations

#: The longest status reason stored (the cause first, then the hint).
REASON_CHARS = 500

#: The statuses the runtime writes in ``connections.status``; a row holding anything else
#: is shown with its value marked unknown. (Here, not in synckit.runtime.admin.tenants, so that
#: ``synckit status`` reads them without importing pydantic and the ciphers.)
CONNECTION_STATUSES = frozenset({"active", "paused", "needs_reauth"})
#: How the pause reason of a tenant held for an unreadable row starts (the worker's
#: start check writes it, the ``unreadable_connection`` alert rule looks for it; here,
#: beside the statuses, so ``synckit status`` reads it without the key machinery).
UNREADABLE_ROW_REASON = "connection row unreadable:"


# --- token sets and the refresh lease ----------------------------------------------------

#: Which connection a row is and its status: the head of the rows that read a connection's
#: state (:func:`read_connection`, :func:`synckit.store.alerts.load_connections`).
STATUS_COLUMNS = (
    connections.c.tenant,
    connections.c.connector,
    connections.c.resource_key,
    connections.c.status,
    connections.c.status_reason,
)


async def read_connection(conn: Conn, tenant: str, *, lock: bool = False) -> Row[Any]:
    """The tenant's connection row (tenant, connector, resource_key, status, token_set...).

    ``lock=True`` takes the per-connection lock until the transaction ends: a row lock
    (``FOR UPDATE``) on PostgreSQL; on SQLite the transaction is ``BEGIN IMMEDIATE``,
    which already holds the database's write lock.
    """
    stmt = select(
        *STATUS_COLUMNS,
        connections.c.token_set,
        connections.c.token_expires_at,
        connections.c.refresh_owner,
        connections.c.refresh_until,
    ).where(connections.c.tenant == tenant)
    if lock:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise ConnectionNotFound(f"no connection for tenant {tenant!r}")
    return row


async def write_token_set(
    conn: Conn,
    tenant: str,
    *,
    sealed: bytes,
    expires_at: datetime | None,
    now: datetime,
    activate: bool = False,
) -> None:
    """Store a sealed token set for the tenant; ``activate`` also sets status active."""
    values: dict[str, Any] = {
        "token_set": sealed,
        "token_expires_at": expires_at,
        "updated_at": now,
    }
    if activate:
        # New credentials from a human: whatever refresh was under way is moot.
        values.update(status="active", status_reason=None, refresh_owner=None, refresh_until=None)
    res = await conn.execute(
        update(connections)
        .where(connections.c.tenant == tenant)
        .values(**values)
        .returning(connections.c.tenant)
    )
    if res.first() is None:
        raise ConnectionNotFound(f"no connection for tenant {tenant!r}")


async def mark_needs_reauth(conn: Conn, tenant: str, *, reason: str, now: datetime) -> None:
    """Set the tenant's connection to ``needs_reauth`` with ``reason`` (redacted here too,
    and cut to 500 characters).

    Any refresh lease is dropped with it: nobody may refresh a refused grant.
    """
    await conn.execute(
        update(connections)
        .where(connections.c.tenant == tenant)
        .values(
            status="needs_reauth",
            status_reason=_stored_reason(reason),
            refresh_owner=None,
            refresh_until=None,
            updated_at=now,
        )
    )


# Who refreshes a tenant's token set, until when (connections.refresh_owner/_until): the
# one lease of store/leases.py on the row's own two columns. It is taken and given back in
# short transactions; the call to the provider runs between them with no transaction open.
REFRESH_LEASE = LeaseColumns(token="refresh_owner", expires_at="refresh_until")


async def take_refresh_lease(
    conn: Conn, tenant: str, *, owner: str, until: datetime, now: datetime
) -> bool:
    """Take the lease if it is free or expired (compare-and-set); True if taken."""
    lease = Lease(owner, until)
    res = await conn.execute(
        claim(
            connections, lease, connections.c.tenant == tenant, now=now, columns=REFRESH_LEASE
        ).returning(connections.c.tenant)
    )
    return res.first() is not None


async def _fence_refresh(
    conn: Conn, tenant: str, owner: str, values: dict[str, Any], *, release: bool = True
) -> bool:
    """Write ``values`` on ``tenant``'s row, ending the refresh lease unless ``release``
    is false, only if ``owner`` still holds it; True if written."""
    res = await conn.execute(
        fenced(
            connections,
            owner,
            connections.c.tenant == tenant,
            values=values,
            release=release,
            columns=REFRESH_LEASE,
        ).returning(connections.c.tenant)
    )
    return res.first() is not None


async def save_refreshed_token_set(
    conn: Conn,
    tenant: str,
    *,
    sealed: bytes,
    expires_at: datetime | None,
    owner: str,
    now: datetime,
) -> bool:
    """Store the refreshed (sealed) set and end the lease, only if ``owner`` still holds
    it (the fence: a holder whose lease ran out and that another took over stores
    nothing); True if stored."""
    values = {"token_set": sealed, "token_expires_at": expires_at, "updated_at": now}
    return await _fence_refresh(conn, tenant, owner, values)


async def hand_back_refresh_lease(
    conn: Conn,
    tenant: str,
    *,
    owner: str,
    until: datetime | None = None,
) -> bool:
    """End ``owner``'s lease; or, with ``until``, keep it held by ``owner`` until then (a
    token endpoint that asked for a wait is not called before it). Fenced: False, and
    nothing written, when ``owner`` no longer holds it."""
    values = {REFRESH_LEASE.expires_at: until} if until else {}
    return await _fence_refresh(conn, tenant, owner, values, release=until is None)


def pause_lanes_sql(source: str) -> Any:
    """SQL pausing the active connections of the lanes ``source`` gives (``resource_key``,
    ``reason``; the DLQ's capture, when a lane's failures say so), stamped ``:now``."""
    return text(
        "UPDATE connections SET status = 'paused', status_reason = v.reason,"
        f" updated_at = :now FROM {source}"
        " WHERE connections.resource_key = v.resource_key AND connections.status = 'active'"
    ).bindparams(bindparam("now", type_=connections.c.updated_at.type))


def poll_spec_marks_sql(source: str) -> Any:
    """SQL writing each tenant's ``poll_spec`` marker from ``source`` (``tenant``,
    ``marker``): what the scheduler last saw of it (store/ticks.py)."""
    return text(
        f"UPDATE connections SET poll_spec = v.marker FROM {source}"
        " WHERE connections.tenant = v.tenant"
    )


async def token_sets_page(conn: Conn, *, after: str, limit: int) -> Sequence[Row[Any]]:
    """Up to ``limit`` (tenant, token_set) rows with a token set, tenants after ``after``
    in order, locked until the transaction ends (key rotation)."""
    return (
        await conn.execute(
            select(connections.c.tenant, connections.c.token_set)
            .where(connections.c.tenant > after, connections.c.token_set.is_not(None))
            .order_by(connections.c.tenant)
            .limit(limit)
            .with_for_update()
        )
    ).all()


async def replace_token_set(conn: Conn, tenant: str, sealed: bytes) -> None:
    """Store a token set re-sealed under another key (nothing else changes)."""
    await conn.execute(
        update(connections).where(connections.c.tenant == tenant).values(token_set=sealed)
    )


async def active_secrets_page(conn: Conn, *, after: str, limit: int) -> Sequence[Row[Any]]:
    """Up to ``limit`` active tenants after ``after``, in order: (tenant, token_set,
    config_text), the config as stored JSON text (the worker's start check)."""
    return (
        await conn.execute(
            select(
                connections.c.tenant,
                connections.c.token_set,
                cast(connections.c.config, Text).label("config_text"),
            )
            .where(connections.c.tenant > after, connections.c.status == "active")
            .order_by(connections.c.tenant)
            .limit(limit)
        )
    ).all()


# --- pending_authorizations: the connect flow's single-use states -------------------------


async def add_pending_authorization(
    conn: Conn,
    *,
    state: str,
    tenant: str,
    sealed_verifier: bytes,
    redirect_uri: str,
    expires_at: datetime,
    now: datetime,
) -> None:
    """Store a consent's ``state`` with its sealed PKCE verifier; expired consents of any
    tenant are deleted on the way (they can never complete)."""
    await conn.execute(
        delete(pending_authorizations).where(pending_authorizations.c.expires_at < now)
    )
    await conn.execute(
        pending_authorizations.insert().values(
            state=state,
            tenant=tenant,
            verifier=sealed_verifier,
            redirect_uri=redirect_uri,
            expires_at=expires_at,
            created_at=now,
        )
    )


async def live_verifiers(conn: Conn, *, now: datetime) -> Sequence[Row[Any]]:
    """Every pending consent's (state, verifier), locked until the transaction ends;
    expired ones are deleted first (key rotation)."""
    p = pending_authorizations.c
    await conn.execute(delete(pending_authorizations).where(p.expires_at < now))
    return (
        await conn.execute(select(p.state, p.verifier).order_by(p.state).with_for_update())
    ).all()


async def replace_verifier(conn: Conn, state: str, sealed: bytes) -> None:
    """Store a verifier re-sealed under another key."""
    p = pending_authorizations.c
    await conn.execute(
        update(pending_authorizations).where(p.state == state).values(verifier=sealed)
    )


async def claim_pending_authorization(
    conn: Conn, *, state: str, tenant: str, now: datetime
) -> Row[Any] | None:
    """Mark ``state`` used, once: its (state, tenant, verifier, redirect_uri) if it was
    issued for ``tenant``, unused and unexpired; else None."""
    p = pending_authorizations.c
    return (
        await conn.execute(
            update(pending_authorizations)
            .where(
                and_(
                    p.state == state,
                    p.tenant == tenant,
                    p.used_at.is_(None),
                    p.expires_at > now,
                )
            )
            .values(used_at=now)
            .returning(p.state, p.tenant, p.verifier, p.redirect_uri)
        )
    ).first()


async def read_pending_authorization(conn: Conn, state: str) -> Row[Any] | None:
    """What is known of ``state`` (tenant, used_at, expires_at), to say why it was refused."""
    p = pending_authorizations.c
    return (
        await conn.execute(select(p.tenant, p.used_at, p.expires_at).where(p.state == state))
    ).first()


# --- after key rotation ---------------------------------------------------------------------


async def compact_sqlite(db: Database) -> None:
    """Rewrite a SQLite file and its WAL so that freed pages keep nothing.

    SQLite keeps freed pages (the rows' old bytes: plaintext secrets, ciphertext under
    the old key) in the file and its WAL until they are reused: after a rotation both are
    rewritten, so a key dropped after rotation opens nothing left on disk.
    """
    # The driver's connection: SQLAlchemy's would open a transaction first (the begin
    # event), and SQLite refuses VACUUM inside one.
    async with db.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        for statement in ("VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"):
            await (await driver.execute(statement)).close()


# --- tenants -------------------------------------------------------------------------------

#: A tenant as every reader reads it (without its tokens): the config as JSON text, parsed
#: per row (a corrupt one is named, not fatal), the timestamps as the driver has them.
TENANT_COLUMNS = (
    connections.c.tenant,
    connections.c.connector,
    connections.c.resource_key,
    cast(connections.c.config, Text).label("config_text"),
    connections.c.schedule,
    connections.c.status,
    connections.c.status_reason,
    *readable((connections.c.created_at, connections.c.updated_at)),
    connections.c.token_set.is_not(None).label("has_tokens"),
)

_GUARDED = ("created_at", "updated_at")
# The same with the timestamps guarded in SQL as well (the read commands): read as text
# alone, a PostgreSQL year 20000 still fails the fetch in the driver.
_GUARDED_COLUMNS = tuple(
    guarded_moment(connections.c[c.name]) if c.name in _GUARDED else c for c in TENANT_COLUMNS
)


async def connector_of(conn: Conn, tenant: str) -> str | None:
    """The connector of ``tenant``'s row, or None when there is none."""
    row = (
        await conn.execute(select(connections.c.connector).where(connections.c.tenant == tenant))
    ).first()
    return None if row is None else str(row.connector)


async def insert_connection(
    conn: Conn,
    *,
    tenant: str,
    connector: str,
    resource_key: str,
    config: dict[str, Any],
    schedule: str,
    now: datetime,
) -> None:
    """A new, active tenant; :class:`ConnectionExists` when its row is there already."""
    try:
        await conn.execute(
            connections.insert().values(
                tenant=tenant,
                connector=connector,
                resource_key=resource_key,
                config=config,
                schedule=schedule,
                status="active",
                created_at=now,
                updated_at=now,
            )
        )
    except IntegrityError as exc:
        raise ConnectionExists(f"tenant {tenant!r} exists already") from exc


async def read_tenant_row(conn: Conn, tenant: str, *, guarded: bool = False) -> Any:
    """``tenant``'s row in :data:`TENANT_COLUMNS`, or None; ``guarded`` reads the
    timestamps through :func:`~synckit.store.moments.guarded_moment` (the read commands)."""
    columns = _GUARDED_COLUMNS if guarded else TENANT_COLUMNS
    return (await conn.execute(select(*columns).where(connections.c.tenant == tenant))).first()


def webhook_tenant_row(conn: SyncConn, tenant: str) -> Any:
    """``tenant``'s (tenant, connector, status, config_text), or None: what a webhook
    delivery's verification needs, read in the delivery's own transaction."""
    c = connections.c
    return conn.execute(
        select(c.tenant, c.connector, c.status, cast(c.config, Text).label("config_text")).where(
            c.tenant == tenant
        )
    ).first()


def tenant_by_config_field(conn: SyncConn, connector: str, field: str, value: str) -> str | None:
    """The tenant of ``connector`` whose (plain, not sealed) config ``field`` is
    ``value``, matched in SQL (one statement, no row is decrypted), or None."""
    c = connections.c
    got: Any
    if conn.dialect.name == "postgresql":
        # The key as text: JSONType would bind it as JSONB (jsonb ->> jsonb: no operator).
        got = c.config.op("->>")(literal(field, Text))
    else:
        got = func.json_extract(c.config, "$." + field)
    row = conn.execute(
        select(c.tenant)
        .where(c.connector == connector, cast(got, Text) == value)
        .order_by(c.tenant)
        .limit(1)
    ).first()
    return None if row is None else str(row.tenant)


def _filtered(stmt: Any, connector: str | None, status: str | None) -> Any:
    if connector:
        stmt = stmt.where(connections.c.connector == connector)
    if status:
        stmt = stmt.where(connections.c.status == status)
    return stmt


async def tenant_rows(
    conn: Conn, *, connector: str | None = None, status: str | None = None
) -> Sequence[Any]:
    """Every tenant's row (of ``connector``, in ``status``, if given), by name."""
    stmt = _filtered(select(*TENANT_COLUMNS), connector, status).order_by(connections.c.tenant)
    return (await conn.execute(stmt)).all()


async def tenant_page_rows(
    conn: Conn,
    *,
    limit: int,
    after: str | None,
    connector: str | None,
    status: str | None,
) -> Sequence[Any]:
    """Up to ``limit`` rows by name after ``after`` (guarded timestamps)."""
    stmt = _filtered(select(*_GUARDED_COLUMNS), connector, status).order_by(connections.c.tenant)
    if after is not None:
        stmt = stmt.where(connections.c.tenant > after)
    return (await conn.execute(stmt.limit(limit))).all()


async def count_tenants_by_status(
    conn: Conn, *, connector: str | None, status: str | None
) -> dict[str, int]:
    """How many tenants (of ``connector``, in ``status``, if given) by stored status."""
    counts = _filtered(
        select(connections.c.status, func.count()).group_by(connections.c.status),
        connector,
        status,
    )
    return {str(s): int(n) for s, n in await conn.execute(counts)}


async def update_connection(
    conn: Conn,
    tenant: str,
    *,
    now: datetime,
    config: dict[str, Any] | None = None,
    schedule: str | None = None,
    reactivate: bool = False,
) -> None:
    """Replace the tenant's config and/or schedule; ``reactivate`` also makes it active
    (new credentials for a tenant that needed them)."""
    values: dict[str, Any] = {"updated_at": now}
    if config is not None:
        values["config"] = config
    if schedule is not None:
        values["schedule"] = schedule
    if reactivate:
        values.update(status="active", status_reason=None)
    await conn.execute(update(connections).where(connections.c.tenant == tenant).values(**values))


async def notify_workers(conn: Conn) -> None:
    """Wake the workers of every process when this transaction commits (PostgreSQL's
    NOTIFY; on SQLite :func:`synckit.store.jobs.enqueueing.target_wake` wakes this process's)."""
    if _is_postgres(conn):
        await conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")


async def set_status(
    conn: Conn, tenant: str, status: str, *, reason: str | None, now: datetime
) -> None:
    """Set the tenant's status (``active``, ``paused``) and its reason."""
    await conn.execute(
        update(connections)
        .where(connections.c.tenant == tenant)
        .values(
            status=status,
            status_reason=None if reason is None else reason[:REASON_CHARS],
            updated_at=now,
        )
    )


async def delete_connection(conn: Conn, tenant: str) -> None:
    """Delete the tenant's row (its poll ticks go with it, by foreign key)."""
    await conn.execute(delete(connections).where(connections.c.tenant == tenant))


async def tenant_dead_letter_counts(conn: Conn, tenant: str) -> dict[str, int]:
    """The tenant's dead letters by status."""
    rows = await conn.execute(
        select(dead_letters.c.status, func.count())
        .where(dead_letters.c.tenant == tenant)
        .group_by(dead_letters.c.status)
    )
    return {str(status): int(count) for status, count in rows}


async def configs_page(conn: Conn, *, after: str, limit: int) -> Sequence[Row[Any]]:
    """Up to ``limit`` (tenant, connector, config_text) rows after ``after``, by name,
    locked until the transaction ends (key rotation)."""
    return (
        await conn.execute(
            select(
                connections.c.tenant,
                connections.c.connector,
                cast(connections.c.config, Text).label("config_text"),
            )
            .where(connections.c.tenant > after)
            .order_by(connections.c.tenant)
            .limit(limit)
            .with_for_update()
        )
    ).all()


async def replace_config(conn: Conn, tenant: str, config: dict[str, Any]) -> None:
    """Store a config re-sealed under another key (``updated_at`` left alone: nothing the
    operator set changed)."""
    await conn.execute(
        update(connections).where(connections.c.tenant == tenant).values(config=config)
    )


async def checkpoint_rows(conn: Conn, tenant: str) -> Sequence[Any]:
    """Every stream's checkpoint of ``tenant`` (connector, stream, cursor as JSON text,
    updated_at guarded), by connector and stream."""
    return (
        await conn.execute(
            select(
                checkpoints.c.connector,
                checkpoints.c.stream,
                # As text, parsed per row: the driver's JSON decoding would fail the read.
                cast(checkpoints.c.cursor, Text).label("cursor"),
                guarded_moment(checkpoints.c.updated_at),
            )
            .where(checkpoints.c.tenant == tenant)
            .order_by(checkpoints.c.connector, checkpoints.c.stream)
        )
    ).all()


# --- tenants in bulk -----------------------------------------------------------------------

#: The fields of one new tenant of :func:`insert_connections`, in this order.
BULK_FIELDS = (
    "tenant",
    "connector",
    "config",
    "schedule",
    "resource_key",
    "parent_key",
    "max_in_flight",
    "rate",
    "burst",
)
_TYPES = ("text", "text", "text", "text", "text", "text", "int", "float8", "int")


_COLUMNS = tuple(zip(BULK_FIELDS, _TYPES, strict=True))


def _source(postgres: bool) -> str:
    return rows_source(postgres, _COLUMNS)


def _statements(postgres: bool) -> tuple[Any, Any, Any, Any]:
    src = _source(postgres)
    config = "CAST(v.config AS jsonb)" if postgres else "v.config"
    names = (
        "unnest(CAST(:names AS text[])) AS n(name)"
        if postgres
        else "(SELECT value AS name FROM json_each(:names)) AS n"
    )
    stamp = bindparam("now", type_=connections.c.created_at.type)
    existing = text(f"SELECT tenant FROM connections WHERE tenant IN (SELECT name FROM {names})")
    lanes, parents = resources_store.bulk_lanes_sql(src)
    insert = text(
        "INSERT INTO connections (tenant, connector, resource_key, config, schedule, status,"
        f" created_at, updated_at) SELECT tenant, connector, resource_key, {config}, schedule,"
        f" 'active', :now, :now FROM {src} WHERE true ON CONFLICT (tenant) DO NOTHING"
        " RETURNING tenant"
    ).bindparams(stamp)
    return existing, lanes, parents, insert


_BULK_SQL = {True: _statements(True), False: _statements(False)}


def _is_postgres(conn: Conn) -> bool:
    return conn.dialect.name == "postgresql"


def _bulk_params(postgres: bool, values: Sequence[Sequence[Any]], now: datetime) -> dict[str, Any]:
    return {**rows_params(postgres, _COLUMNS, values), "now": now}


async def existing_tenants(conn: Conn, names: Sequence[str]) -> set[str]:
    """Which of ``names`` are tenants already: one statement, the names one array."""
    postgres = _is_postgres(conn)
    param: Any = list_param(postgres, names)
    return {r[0] for r in await conn.execute(_BULK_SQL[postgres][0], {"names": param})}


async def insert_connections(
    conn: Conn, rows: Sequence[Sequence[Any]], *, now: datetime
) -> set[str]:
    """Add tenants (each a sequence of :data:`BULK_FIELDS`, the config as JSON text), with
    their resources (the connector's limits) and the resources' parents, in three
    statements whatever the number of rows; the tenants created (one that exists is
    left alone)."""
    postgres = _is_postgres(conn)
    _, lanes, parents, insert = _BULK_SQL[postgres]
    # One row per resource key: an upsert may not touch a row twice in one statement.
    per_lane = list({row[4]: row for row in rows}.values())
    await conn.execute(lanes, _bulk_params(postgres, per_lane, now))
    await conn.execute(parents, _bulk_params(postgres, per_lane, now))
    return {r[0] for r in await conn.execute(insert, _bulk_params(postgres, rows, now))}


# --- the runtime's operations on connections (budgets, re-authorisation) ----------------


async def pause_active(
    conn: Conn, tenants: Iterable[str], *, reason: str, now: datetime
) -> list[str]:
    """Pause the active connections of ``tenants`` (a connection waiting for
    re-authorisation or already paused is left as it is); return the tenants paused."""
    wanted = sorted(set(tenants))
    if not wanted:
        return []
    res = await conn.execute(
        update(connections)
        .where(connections.c.tenant.in_(wanted), connections.c.status == "active")
        .values(status="paused", status_reason=reason[:REASON_CHARS], updated_at=now)
        .returning(connections.c.tenant)
    )
    return sorted(r[0] for r in res)


def mark_needs_reauth_sync(
    conn: SyncConn, resource_key: str, reason: str, *, now: datetime
) -> None:
    """The connection of ``resource_key`` waits for re-authorisation (``reason`` redacted
    and cut to 500 characters), in the caller's transaction."""
    conn.execute(
        update(connections)
        .where(connections.c.resource_key == resource_key)
        .values(status="needs_reauth", status_reason=_stored_reason(reason), updated_at=now)
    )


def _stored_reason(reason: str) -> str:
    """A ``needs_reauth`` reason as stored: redacted (whoever wrote it), storable, bounded."""
    return storable_text(redact_text(reason))[:REASON_CHARS]

"""Streams' positions: the ``checkpoints`` table, and what a poll cycle reads before its
first page and checks at each page's commit.

The hot statements of a cycle are built once. SQLAlchemy never caches a dialect's
``insert().on_conflict_do_update()`` (its cache key is None: it was compiled at every
page), so the upserts are text with typed parameters; ``INSERT ... ON CONFLICT (...) DO
UPDATE`` is spelt the same on SQLite (>= 3.24) and PostgreSQL.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, bindparam, delete, func, select, text, type_coerce
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.db import Database
from synckit.store.tables import checkpoints, connections, dead_letters, jobs, resources

__all__ = [
    "NUL_SAFE_KEY",
    "CycleStart",
    "PollStartReads",
    "cycle_start_of",
    "delete_checkpoints",
    "holds_claim",
    "list_checkpoints",
    "load_checkpoint",
    "oldest_active_checkpoints",
    "read_cursor",
    "read_cycle_start",
    "save_checkpoint",
    "save_checkpoint_held",
    "stored_cursor",
]

_CHECKPOINT_OF = select(checkpoints.c.cursor).where(
    checkpoints.c.tenant == bindparam("tenant"),
    checkpoints.c.connector == bindparam("connector"),
    checkpoints.c.stream == bindparam("stream"),
)
_OPEN = ("pending", "review")
_HAS_OPEN = (
    select(dead_letters.c.id)
    .where(
        dead_letters.c.tenant == bindparam("tenant"),
        dead_letters.c.connector == bindparam("connector"),
        dead_letters.c.kind == bindparam("kind"),
        dead_letters.c.status.in_(_OPEN),
    )
    .limit(1)
)
# One round trip for what a cycle reads before its first page.
_CYCLE_START = select(_CHECKPOINT_OF.scalar_subquery(), _HAS_OPEN.exists())
_SAVE_CHECKPOINT = text(
    "INSERT INTO checkpoints (tenant, connector, stream, cursor, updated_at)"
    " VALUES (:tenant, :connector, :stream, :cursor, :updated_at)"
    " ON CONFLICT (tenant, connector, stream)"
    " DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at"
).bindparams(
    bindparam("cursor", type_=checkpoints.c.cursor.type),
    bindparam("updated_at", type_=checkpoints.c.updated_at.type),
)


# The page's checkpoint and the check that its job still holds the claim, in one
# statement: nothing is written (rowcount 0) when it does not, and on PostgreSQL the job's
# row stays locked until the page commits, so a rescue cannot slip in between.
def _save_checkpoint_held(lock: str) -> Any:
    return text(
        "INSERT INTO checkpoints (tenant, connector, stream, cursor, updated_at)"
        " SELECT :tenant, :connector, :stream, :cursor, :updated_at WHERE EXISTS"
        " (SELECT 1 FROM jobs WHERE id = :id AND claim_token = :token"
        f" AND status = 'running'{lock})"
        " ON CONFLICT (tenant, connector, stream)"
        " DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at"
    ).bindparams(
        bindparam("cursor", type_=checkpoints.c.cursor.type),
        bindparam("updated_at", type_=checkpoints.c.updated_at.type),
    )


_SAVE_CHECKPOINT_HELD = {
    "postgresql": _save_checkpoint_held(" FOR UPDATE"),
    "sqlite": _save_checkpoint_held(""),
}
# The claim check of a page that keeps the checkpoint as it is (locking as above).
_HOLDS = (
    select(jobs.c.id)
    .where(
        jobs.c.id == bindparam("id"),
        jobs.c.claim_token == bindparam("token"),
        jobs.c.status == "running",
    )
    .with_for_update()
)


@dataclass(frozen=True)
class CycleStart:
    """What a cycle reads before its first page: the stream's stored checkpoint (None
    before its first page) and whether the stream has open (pending or review) dead
    letters of records, which succeeding records then resolve."""

    checkpoint: Any
    open_dead_letters: bool


#: The stored form of a checkpoint holding a NUL character (see :func:`stored_cursor`).
NUL_SAFE_KEY = "$synckit_json"


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _has_nul(value: Any) -> bool:
    """Whether a string in ``value`` holds NUL or a lone surrogate (no engine stores it)."""
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def stored_cursor(cursor: Any) -> Any:
    """The checkpoint as stored. A cursor whose strings hold NUL (which PostgreSQL's
    JSON types refuse, failing the page's commit on every retry) or a lone surrogate
    (which no driver encodes) is stored as its JSON
    text under :data:`NUL_SAFE_KEY`, where the NUL is the six characters of its escape;
    :func:`read_cursor` restores it exactly, on both engines."""
    # A cursor that looks like the stored form is wrapped too, so that it reads back as
    # itself.
    if _has_nul(cursor) or (isinstance(cursor, dict) and list(cursor) == [NUL_SAFE_KEY]):
        return {NUL_SAFE_KEY: json.dumps(cursor)}
    return cursor


def read_cursor(stored: Any) -> Any:
    """The connector's checkpoint from its stored form (:func:`stored_cursor`)."""
    if isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get(NUL_SAFE_KEY), str):
        try:
            return json.loads(stored[NUL_SAFE_KEY])
        except ValueError:
            return stored
    return stored


def read_cycle_start(
    conn: Connection, tenant: str, connector: str, stream: str, kind: str
) -> CycleStart:
    """:class:`CycleStart` of the stream (whose record dead letters are of ``kind``), in
    the caller's transaction (one statement)."""
    params = {"tenant": tenant, "connector": connector, "stream": stream, "kind": kind}
    row = conn.execute(_CYCLE_START, params).one()
    return cycle_start_of(row[0], row[1])


def _cycle_start_columns(tenant: Any, connector: Any, stream: Any, kind: Any) -> tuple[Any, Any]:
    """The two columns :func:`read_cycle_start` reads, of the stream given by column
    expressions, for a statement that reads them with other things (the poll jobs read
    them with their tenants: :class:`PollStartReads`)."""
    cursor = select(checkpoints.c.cursor).where(
        checkpoints.c.tenant == tenant,
        checkpoints.c.connector == connector,
        checkpoints.c.stream == stream,
    )
    has_open = (
        select(dead_letters.c.id)
        .where(
            dead_letters.c.tenant == tenant,
            dead_letters.c.connector == connector,
            dead_letters.c.kind == kind,
            dead_letters.c.status.in_(_OPEN),
        )
        .limit(1)
    )
    return (
        cursor.scalar_subquery().label("start_cursor"),
        has_open.exists().label("start_open_dead_letters"),
    )


def cycle_start_of(stored_cursor: Any, open_dead_letters: Any) -> CycleStart:
    """The :class:`CycleStart` of the values a start read gives."""
    return CycleStart(read_cursor(stored_cursor), bool(open_dead_letters))


async def load_checkpoint(
    target: Database | AsyncConnection, tenant: str, connector: str, stream: str
) -> Any:
    """The stored checkpoint of the stream, or None before its first page."""
    params = {"tenant": tenant, "connector": connector, "stream": stream}
    if isinstance(target, Database):
        async with target.read() as conn:
            return read_cursor((await conn.execute(_CHECKPOINT_OF, params)).scalar())
    return read_cursor((await target.execute(_CHECKPOINT_OF, params)).scalar())


def save_checkpoint(
    conn: Connection, tenant: str, connector: str, stream: str, cursor: Any, now: datetime
) -> None:
    """Store the stream's checkpoint, in the caller's transaction (a synchronous
    connection: :meth:`Database.write`)."""
    conn.execute(
        _SAVE_CHECKPOINT,
        {
            "tenant": tenant,
            "connector": connector,
            "stream": stream,
            "cursor": stored_cursor(cursor),
            "updated_at": now,
        },
    )


def save_checkpoint_held(
    conn: Connection,
    tenant: str,
    connector: str,
    stream: str,
    cursor: Any,
    now: datetime,
    *,
    job_id: int,
    token: int,
) -> bool:
    """:func:`save_checkpoint` if job ``job_id`` still holds its claim ``token`` (on
    PostgreSQL its row then stays locked until the caller commits); False, with nothing
    written, when it does not. One statement."""
    saved = conn.execute(
        _SAVE_CHECKPOINT_HELD[conn.dialect.name],
        {
            "tenant": tenant,
            "connector": connector,
            "stream": stream,
            "cursor": stored_cursor(cursor),
            "updated_at": now,
            "id": job_id,
            "token": token,
        },
    )
    return bool(saved.rowcount)


@dataclass(frozen=True)
class HeldCheckpoint:
    """One page's checkpoint for :func:`save_checkpoints_held`, written if job ``job_id``
    still holds its claim ``token``."""

    tenant: str
    connector: str
    stream: str
    cursor: Any
    updated_at: datetime
    job_id: int
    token: int


# The pages' checkpoints of a group, each written if its job still holds its
# claim: :data:`_SAVE_CHECKPOINT_HELD` for many pages, one statement. The rows come in the
# order given, so the job rows are locked in that order.
_SAVE_CHECKPOINTS_HELD_PG = text(
    "INSERT INTO checkpoints (tenant, connector, stream, cursor, updated_at)"
    " SELECT v.tenant, v.connector, v.stream, CAST(v.cursor AS jsonb), v.updated_at"
    " FROM unnest(CAST(:tenants AS text[]), CAST(:connectors AS text[]),"
    " CAST(:streams AS text[]), CAST(:cursors AS text[]),"
    " CAST(:updated AS timestamptz[]), CAST(:ids AS bigint[]), CAST(:tokens AS bigint[]))"
    " WITH ORDINALITY AS v(tenant, connector, stream, cursor, updated_at, id, token, n)"
    " WHERE EXISTS (SELECT 1 FROM jobs WHERE jobs.id = v.id AND jobs.claim_token = v.token"
    " AND jobs.status = 'running' FOR UPDATE)"
    " ORDER BY v.n"
    " ON CONFLICT (tenant, connector, stream)"
    " DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at"
    " RETURNING tenant, connector, stream"
)


# The same for SQLite: the pages as one JSON array parameter (each cursor as the JSON
# text the column's own bind writes, each time as its bind writes it).
_SAVE_CHECKPOINTS_HELD_SQLITE = text(
    "INSERT INTO checkpoints (tenant, connector, stream, cursor, updated_at)"
    " SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),"
    " json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]')"
    " FROM json_each(:pages)"
    " WHERE EXISTS (SELECT 1 FROM jobs WHERE jobs.id = json_extract(value, '$[5]')"
    " AND jobs.claim_token = json_extract(value, '$[6]') AND jobs.status = 'running')"
    " ON CONFLICT (tenant, connector, stream)"
    " DO UPDATE SET cursor = excluded.cursor, updated_at = excluded.updated_at"
    " RETURNING tenant, connector, stream"
)
#: SQLite has RETURNING from 3.35.
_SQLITE_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)


def save_checkpoints_held(conn: Connection, pages: Sequence[HeldCheckpoint]) -> list[bool]:
    """:func:`save_checkpoint_held` for each of ``pages``, in one statement: whether each
    was written. Two pages of one stream must not come together (an upsert may not touch
    one row twice: the statement fails)."""
    postgres = conn.dialect.name == "postgresql"
    if len(pages) < 2 or not (postgres or _SQLITE_RETURNING):
        return [
            save_checkpoint_held(
                conn, p.tenant, p.connector, p.stream, p.cursor, p.updated_at,
                job_id=p.job_id, token=p.token,
            )
            for p in pages
        ]  # fmt: skip
    if not postgres:
        stamp = checkpoints.c.updated_at.type.dialect_impl(conn.dialect).bind_processor(
            conn.dialect
        )
        rows = [
            [
                p.tenant, p.connector, p.stream, json.dumps(stored_cursor(p.cursor)),
                stamp(p.updated_at) if stamp else p.updated_at, p.job_id, p.token,
            ]
            for p in pages
        ]  # fmt: skip
        found = conn.execute(_SAVE_CHECKPOINTS_HELD_SQLITE, {"pages": json.dumps(rows)})
        saved = {tuple(r) for r in found}
        return [(p.tenant, p.connector, p.stream) in saved for p in pages]
    params = {
        "tenants": [p.tenant for p in pages],
        "connectors": [p.connector for p in pages],
        "streams": [p.stream for p in pages],
        # As the JSON column's own bind writes them: json.dumps, None as JSON null.
        "cursors": [json.dumps(stored_cursor(p.cursor)) for p in pages],
        "updated": [p.updated_at for p in pages],
        "ids": [p.job_id for p in pages],
        "tokens": [p.token for p in pages],
    }
    saved = {tuple(r) for r in conn.execute(_SAVE_CHECKPOINTS_HELD_PG, params)}
    return [(p.tenant, p.connector, p.stream) in saved for p in pages]


def holds_claim(conn: Connection, job_id: int, token: int) -> bool:
    """Whether job ``job_id`` still holds its claim ``token`` (running); on PostgreSQL its
    row then stays locked until the caller commits."""
    return conn.execute(_HOLDS, {"id": job_id, "token": token}).first() is not None


async def list_checkpoints(db: Database, tenant: str) -> list[tuple[str, str, Any, datetime]]:
    """``(connector, stream, cursor, updated_at)`` of every stream of ``tenant``."""
    async with db.read() as conn:
        rows = await conn.execute(
            select(
                checkpoints.c.connector,
                checkpoints.c.stream,
                checkpoints.c.cursor,
                checkpoints.c.updated_at,
            )
            .where(checkpoints.c.tenant == tenant)
            .order_by(checkpoints.c.connector, checkpoints.c.stream)
        )
        return [(r.connector, r.stream, read_cursor(r.cursor), r.updated_at) for r in rows]


async def delete_checkpoints(conn: AsyncConnection, tenant: str) -> None:
    await conn.execute(delete(checkpoints).where(checkpoints.c.tenant == tenant))


async def oldest_active_checkpoints(conn: AsyncConnection) -> list[tuple[str, str, Any]]:
    """``(connector, stream, stored)`` per connector and stream: when the oldest checkpoint
    of an active tenant was stored, as the driver hands it over (text on SQLite; read it
    with :func:`~synckit.store.moments.read_moment`, which names a value no datetime holds).
    One grouped read."""
    oldest = type_coerce(func.min(checkpoints.c.updated_at), String)
    rows = await conn.execute(
        select(checkpoints.c.connector, checkpoints.c.stream, oldest)
        .join(connections, connections.c.tenant == checkpoints.c.tenant)
        .where(connections.c.status == "active")
        .group_by(checkpoints.c.connector, checkpoints.c.stream)
    )
    return [(connector, stream, raw) for connector, stream, raw in rows]


# --- what a poll job reads first --------------------------------------------------------
#
# Before its cycle a poll job reads its tenant's row, its stream's CycleStart and its
# resource's pacing (its own and its parent's next_available_at, the quota last reported)
# in one statement; the jobs of one process that start together read in one statement,
# their keys one array parameter (synckit.runtime.sync.poll_jobs._StartReads).


def _start_statement(tenant_columns: Sequence[Any], wanted: Any) -> Any:
    v = wanted.subquery("wanted")
    res = resources.alias("pace_resource")
    parent = resources.alias("pace_parent")
    return select(
        v.c.tenant.label("want_tenant"),
        v.c.connector.label("want_connector"),
        v.c.stream.label("want_stream"),
        *tenant_columns,
        *_cycle_start_columns(v.c.tenant, v.c.connector, v.c.stream, v.c.kind),
        res.c.next_available_at,
        res.c.quota_limit,
        res.c.quota_remaining,
        res.c.quota_reset_at,
        res.c.quota_at,
        parent.c.next_available_at.label("parent_available_at"),
    ).select_from(
        v.join(connections, connections.c.tenant == v.c.tenant)
        .outerjoin(res, res.c.resource_key == connections.c.resource_key)
        .outerjoin(parent, parent.c.resource_key == res.c.parent_key)
    )


_WANTED_COLUMNS = {n: String for n in ("tenant", "connector", "stream", "kind")}


class PollStartReads:
    """The poll jobs' start read, built once for the tenant columns it reads (those of
    the tenant reader that makes the tenant of a row)."""

    def __init__(self, tenant_columns: Sequence[Any]) -> None:
        # The keys as one JSON array of [tenant, connector, stream, kind] (SQLite) or
        # four arrays (PostgreSQL).
        self.statements = {
            "sqlite": _start_statement(
                tenant_columns,
                text(
                    "SELECT json_extract(value, '$[0]') AS tenant, json_extract(value, '$[1]')"
                    " AS connector, json_extract(value, '$[2]') AS stream,"
                    " json_extract(value, '$[3]') AS kind FROM json_each(:wanted)"
                ).columns(**_WANTED_COLUMNS),
            ),
            "postgresql": _start_statement(
                tenant_columns,
                text(
                    "SELECT tenant, connector, stream, kind FROM unnest(CAST(:tenants AS text[]),"
                    " CAST(:connectors AS text[]), CAST(:streams AS text[]),"
                    " CAST(:kinds AS text[])) AS w(tenant, connector, stream, kind)"
                ).columns(**_WANTED_COLUMNS),
            ),
        }

    def rows(self, conn: Connection, wanted: Sequence[tuple[str, str, str, str]]) -> Any:
        """The rows of ``wanted`` ``(tenant, connector, stream, kind)`` whose tenant
        exists: ``want_tenant``, ``want_connector``, ``want_stream``, the tenant columns,
        ``start_cursor`` and ``start_open_dead_letters`` (:func:`cycle_start_of`),
        ``next_available_at``, ``quota_*`` and ``parent_available_at``."""
        if conn.dialect.name == "postgresql":
            params: dict[str, Any] = {
                name: [w[i] for w in wanted]
                for i, name in enumerate(("tenants", "connectors", "streams", "kinds"))
            }
        else:
            params = {"wanted": json.dumps(wanted)}
        return conn.execute(self.statements[conn.dialect.name], params)

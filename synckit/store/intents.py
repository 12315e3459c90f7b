"""Every SQL statement on ``intents``, named (the runtime side is
:mod:`synckit.runtime.writes.intents`).

One row per intended create: ``pending`` until the remote id is recorded (``done``). A
run holds a pending intent under the one lease (:mod:`synckit.store.leases`) while it
calls the API, outside any transaction; each operation here is one short transaction.
``result`` holds the create's record once done, and ``{"_last_error": ...}`` while a
failed attempt leaves the intent pending.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.errors.exceptions import SynckitError
from synckit.store import leases
from synckit.store.db import Database
from synckit.store.leases import Lease
from synckit.store.tables import dialect_insert, intents

__all__ = ["IntentRow", "claim", "finish", "release"]


@dataclass(frozen=True)
class IntentRow:
    """One intent as stored."""

    key: str
    status: str
    fingerprint: str
    remote_id: str | None
    result: Any
    attempts: int
    lease_token: str | None
    lease_expires_at: datetime | None

    @classmethod
    def of(cls, r: Row[Any]) -> IntentRow:
        return cls(
            r.intent_key,
            r.status,
            r.fingerprint,
            r.remote_id,
            r.result,
            r.attempts,
            r.lease_token,
            r.lease_expires_at,
        )


def _where(tenant: str, connector: str, key: str) -> Any:
    c = intents.c
    return (c.tenant == tenant) & (c.connector == connector) & (c.intent_key == key)


async def _locked(conn: AsyncConnection, tenant: str, connector: str, key: str) -> IntentRow:
    row = (
        await conn.execute(select(intents).where(_where(tenant, connector, key)).with_for_update())
    ).first()
    if row is None:
        raise SynckitError(f"intent {key!r} of tenant {tenant!r} disappeared while in use")
    return IntentRow.of(row)


async def claim(
    db: Database,
    *,
    tenant: str,
    connector: str,
    key: str,
    fingerprint: str,
    lease: Lease,
    now: datetime,
) -> tuple[IntentRow, bool]:
    """Insert the intent (pending) if new, then take it under ``lease`` when it is pending,
    was made with ``fingerprint`` and no other lease holds it; count the attempt.

    Returns the row and whether this call took it: when it did not, the row says why
    (another fingerprint, already done, or the lease that holds it).
    """
    async with db.begin() as conn:
        insert = dialect_insert(conn)
        await conn.execute(
            insert(intents)
            .values(
                tenant=tenant,
                connector=connector,
                intent_key=key,
                status="pending",
                fingerprint=fingerprint,
                attempts=0,
                result=None,
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["tenant", "connector", "intent_key"])
        )
        taken = (
            await conn.execute(
                leases.claim(
                    intents,
                    lease,
                    _where(tenant, connector, key),
                    intents.c.status == "pending",
                    intents.c.fingerprint == fingerprint,
                    now=now,
                    values={"attempts": intents.c.attempts + 1, "updated_at": now},
                ).returning(*intents.c)
            )
        ).first()
        if taken is not None:
            return IntentRow.of(taken), True
        return await _locked(conn, tenant, connector, key), False


async def release(
    db: Database,
    *,
    tenant: str,
    connector: str,
    key: str,
    token: str,
    error: str,
    now: datetime,
) -> bool:
    """End the lease ``token`` holds after a failed call, keeping ``error`` in
    ``result._last_error`` for whoever looks; False if the lease no longer holds."""
    async with db.begin() as conn:
        row = await _locked(conn, tenant, connector, key)
        if row.status != "pending" or row.lease_token != token:
            return False
        meta = dict(row.result) if isinstance(row.result, Mapping) else {}
        meta["_last_error"] = error
        res = await conn.execute(
            leases.fenced(
                intents,
                token,
                _where(tenant, connector, key),
                intents.c.status == "pending",
                values={"result": meta, "updated_at": now},
            )
        )
        return bool(res.rowcount)


async def finish(
    db: Database,
    *,
    tenant: str,
    connector: str,
    key: str,
    remote_id: str,
    result: Any,
    now: datetime,
) -> tuple[IntentRow, bool]:
    """Record the remote id (``done``) and end any lease; if the intent is done already,
    that record stands. Returns the row and whether this call recorded it.

    Not fenced by the caller's token, on purpose: the resource exists once the API said
    so, whoever holds the lease now; a run that took over will find the intent done.
    """
    async with db.begin() as conn:
        row = await _locked(conn, tenant, connector, key)
        if row.status == "done":
            return row, False
        await conn.execute(
            update(intents)
            .where(_where(tenant, connector, key))
            .values(
                status="done",
                remote_id=remote_id,
                result=result,
                updated_at=now,
                **leases.RELEASED,
            )
        )
    return row, True

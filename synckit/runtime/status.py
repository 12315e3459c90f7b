"""What ``synckit status`` reports: a read-only snapshot of the runtime's tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from synckit.runtime.db import Database
from synckit.runtime.schema import connections, dead_letters, jobs, outbox, resources


@dataclass(frozen=True)
class TenantStatus:
    tenant: str
    connector: str
    status: str
    breaker: str
    next_available_at: datetime | None
    dlq_pending: int


@dataclass(frozen=True)
class Status:
    database: str
    queue: dict[str, dict[str, int]] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    outbox_pending: int = 0
    tenants: list[TenantStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for t in data["tenants"]:
            if t["next_available_at"] is not None:
                t["next_available_at"] = t["next_available_at"].isoformat()
        return data


async def read_status(db: Database) -> Status:
    """Queue depth by kind and status, DLQ rows by status, and each tenant's health."""
    async with db.begin() as conn:
        queue: dict[str, dict[str, int]] = {}
        rows = await conn.execute(
            select(jobs.c.kind, jobs.c.status, func.count()).group_by(jobs.c.kind, jobs.c.status)
        )
        for kind, status, count in rows:
            queue.setdefault(kind, {})[status] = count
        dlq = {
            status: count
            for status, count in await conn.execute(
                select(dead_letters.c.status, func.count()).group_by(dead_letters.c.status)
            )
        }
        outbox_pending = (
            await conn.execute(
                select(func.count()).select_from(outbox).where(outbox.c.status == "pending")
            )
        ).scalar_one()
        dlq_by_tenant = {
            tenant: count
            for tenant, count in await conn.execute(
                select(dead_letters.c.tenant, func.count())
                .where(dead_letters.c.status.in_(["pending", "review"]))
                .group_by(dead_letters.c.tenant)
            )
        }
        tenant_rows = await conn.execute(
            select(
                connections.c.tenant,
                connections.c.connector,
                connections.c.status,
                resources.c.state,
                resources.c.next_available_at,
            )
            .select_from(
                connections.outerjoin(
                    resources, resources.c.resource_key == connections.c.resource_key
                )
            )
            .order_by(connections.c.tenant)
        )
        tenants = [
            TenantStatus(
                tenant=r.tenant,
                connector=r.connector,
                status=r.status,
                breaker=r.state or "closed",
                next_available_at=r.next_available_at,
                dlq_pending=dlq_by_tenant.get(r.tenant, 0),
            )
            for r in tenant_rows
        ]
    return Status(
        database=db.display_url,
        queue=queue,
        dead_letters=dlq,
        outbox_pending=outbox_pending,
        tenants=tenants,
    )

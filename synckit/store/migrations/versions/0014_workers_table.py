"""workers table: worker processes register and heartbeat (issue 34)

One row per worker process (``synckit.store.workers``): host, pid, version, concurrency,
its heartbeat period, jobs in flight, started, last seen and stopped. A worker silent for
several heartbeat periods is shown as lost.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 12:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, synckit.store.tables.UTCDateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("heartbeat_seconds", sa.Float(), nullable=False),
        sa.Column("in_flight", sa.Integer(), nullable=False, server_default="0"),
        _ts("started_at", nullable=False),
        _ts("last_seen_at", nullable=False),
        _ts("stopped_at"),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    op.create_index("ix_workers_last_seen_at", "workers", ["last_seen_at"])


def downgrade() -> None:
    op.drop_index("ix_workers_last_seen_at", table_name="workers")
    op.drop_table("workers")

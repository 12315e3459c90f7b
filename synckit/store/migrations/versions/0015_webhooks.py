"""webhook inbox: webhook_events, webhook_refusals, webhook_triggers

The inbox of provider events (``synckit.store.webhooks``): one row per (connector,
tenant, event id), written before the delivery is answered 2xx; refused deliveries
counted per connector and tenant; and when events last triggered each tenant's stream
(the coalescing window).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import synckit.store.tables

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_TS = synckit.store.tables.UTCDateTime(timezone=True)
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhook_events",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("connector", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("event_id", sa.String(length=300), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("claimed", sa.String(length=200), nullable=True),
        sa.Column("headers", _JSON, nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("duplicates", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("received_at", _TS, nullable=False),
        sa.Column("processed_at", _TS, nullable=True),
        sa.Column("lease_token", sa.String(length=100), nullable=True),
        sa.Column("lease_expires_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_events")),
        sa.UniqueConstraint("connector", "tenant", "event_id", name="uq_webhook_events_event"),
    )
    op.create_index(
        "ix_webhook_events_pending",
        "webhook_events",
        ["tenant", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "webhook_refusals",
        sa.Column("connector", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_reason", sa.Text(), nullable=True),
        sa.Column("last_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("connector", "tenant", name=op.f("pk_webhook_refusals")),
    )
    op.create_table(
        "webhook_triggers",
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("stream", sa.String(length=200), nullable=False),
        sa.Column("last_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("tenant", "stream", name=op.f("pk_webhook_triggers")),
    )


def downgrade() -> None:
    op.drop_table("webhook_triggers")
    op.drop_table("webhook_refusals")
    op.drop_index("ix_webhook_events_pending", table_name="webhook_events")
    op.drop_table("webhook_events")

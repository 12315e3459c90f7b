"""webhook subscriptions: webhook_subscriptions

A provider's webhook subscription per tenant and stream (``synckit.store.subscriptions``):
its id at the provider, its expiry, its state (pending, active, lapsed, failed), the
failures in a row and the last error, and ``next_at``, when the runtime renews or
retries it (indexed: the sweep reads only what is due). Deleted with its tenant.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_TS = synckit.store.tables.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("stream", sa.String(length=200), nullable=False),
        sa.Column("connector", sa.String(length=200), nullable=False),
        sa.Column("subscription_id", sa.String(length=500), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
        sa.Column("renewed_at", _TS, nullable=True),
        sa.Column("next_at", _TS, nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_error_class", sa.String(length=64), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"],
            ["connections.tenant"],
            name=op.f("fk_webhook_subscriptions_tenant_connections"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant", "stream", name=op.f("pk_webhook_subscriptions")),
    )
    op.create_index(
        "ix_webhook_subscriptions_next_at", "webhook_subscriptions", ["next_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_subscriptions_next_at", table_name="webhook_subscriptions")
    op.drop_table("webhook_subscriptions")

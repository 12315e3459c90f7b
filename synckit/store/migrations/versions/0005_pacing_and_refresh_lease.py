"""pacing state and the token refresh lease

Rate-limit events (streak, start), why a resource is paced, the quota the API last
reported (adaptive pacing across workers), the breaker probe's expiry, and the lease
that makes a token refresh single-flight without holding a database lock across the
call to the provider.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _ts(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, synckit.store.tables.UTCDateTime(timezone=True), nullable=True)


def upgrade() -> None:
    with op.batch_alter_table("resources", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("rate_limit_streak", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(_ts("rate_limited_at"))
        batch_op.add_column(sa.Column("paced_reason", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("quota_limit", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("quota_remaining", sa.Integer(), nullable=True))
        batch_op.add_column(_ts("quota_reset_at"))
        batch_op.add_column(_ts("quota_at"))
        batch_op.add_column(_ts("probe_expires_at"))
    with op.batch_alter_table("connections", schema=None) as batch_op:
        batch_op.add_column(sa.Column("refresh_owner", sa.String(length=100), nullable=True))
        batch_op.add_column(_ts("refresh_until"))


def downgrade() -> None:
    with op.batch_alter_table("connections", schema=None) as batch_op:
        batch_op.drop_column("refresh_until")
        batch_op.drop_column("refresh_owner")
    with op.batch_alter_table("resources", schema=None) as batch_op:
        for name in (
            "probe_expires_at",
            "quota_at",
            "quota_reset_at",
            "quota_remaining",
            "quota_limit",
            "paced_reason",
            "rate_limited_at",
            "rate_limit_streak",
        ):
            batch_op.drop_column(name)

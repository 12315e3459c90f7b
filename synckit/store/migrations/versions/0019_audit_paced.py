"""audit paced: audit_buckets.paced

Job attempts that ended paced (rate limited: rescheduled for when their resource is
available, attempt not spent, not a failure), counted per tenant, connector, minute and
application version beside ``ok`` and ``failed``, in the transaction that records them.
The console's throughput chart draws them as their own series.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 16:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_buckets") as batch:
        batch.add_column(sa.Column("paced", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("audit_buckets") as batch:
        batch.drop_column("paced")

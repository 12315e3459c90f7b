"""outbox: partial indexes for the relay's claim

The claim read every pending message and sorted them (and scanned every pending
message of the claimed keys for blockers), so its cost grew with the backlog. Pending
messages by id, and by key and id, make both reads about as long as the batch.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 03:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.create_index(
        "ix_outbox_pending_id",
        "outbox",
        ["id"],
        postgresql_where=_PENDING,
        sqlite_where=_PENDING,
    )
    op.create_index(
        "ix_outbox_pending_key",
        "outbox",
        ["key", "id"],
        postgresql_where=_PENDING,
        sqlite_where=_PENDING,
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_pending_key", table_name="outbox")
    op.drop_index("ix_outbox_pending_id", table_name="outbox")

"""queue_samples table: the queue's depth over time (issue 34)

One row per minute (``synckit.store.queue_history``), written by whichever worker gets
there first: pending jobs that are ready, scheduled for later, waiting to retry after an
error, or paced (their resource's rate limit), and running jobs. Kept for a day.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 15:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_samples",
        sa.Column("minute", synckit.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("ready", sa.Integer(), nullable=False),
        sa.Column("scheduled", sa.Integer(), nullable=False),
        sa.Column("retrying", sa.Integer(), nullable=False),
        sa.Column("paced", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("capped", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("minute", name=op.f("pk_queue_samples")),
    )


def downgrade() -> None:
    op.drop_table("queue_samples")

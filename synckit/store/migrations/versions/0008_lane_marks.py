"""resources.due_at: the lanes a claim starts from, and their index in fairness order

``due_at`` is NULL for a lane with no pending job, else no later than its earliest pending
job's ``run_at``; ``ix_resources_lanes`` holds the marked lanes ordered by
``last_claimed_at`` (never-claimed first), so a claim walks the lanes with work in
fairness order and stops at its LIMIT instead of reading every resource.

The marks of existing lanes are filled in from their pending jobs.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("resources", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("due_at", synckit.store.tables.UTCDateTime(timezone=True), nullable=True)
        )
    op.execute(
        "UPDATE resources SET due_at = (SELECT min(j.run_at) FROM jobs j"
        " WHERE j.status = 'pending' AND j.resource_key = resources.resource_key)"
        " WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.status = 'pending'"
        " AND j.resource_key = resources.resource_key)"
    )
    # PostgreSQL serves ORDER BY ... NULLS FIRST only from an index ordered so; SQLite
    # sorts NULLs first anyway and has no NULLS FIRST in CREATE INDEX.
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_index(
        "ix_resources_lanes",
        "resources",
        [sa.text("last_claimed_at NULLS FIRST") if postgres else "last_claimed_at"],
        unique=False,
        postgresql_where=sa.text("due_at IS NOT NULL"),
        sqlite_where=sa.text("due_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_resources_lanes", table_name="resources")
    with op.batch_alter_table("resources", schema=None) as batch_op:
        batch_op.drop_column("due_at")

"""jobs: index (kind, status) instead of (status, kind)

An index led by ``status`` made SQLite's planner answer every claim with it: a lookup of
all pending rows and a sort of the whole backlog, per claim. Led by ``kind`` it no longer
matches the claim, which then walks ``ix_jobs_due``/``ix_jobs_lane_due`` in claim order.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 02:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_jobs_status_kind", table_name="jobs")
    op.create_index("ix_jobs_kind_status", "jobs", ["kind", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_kind_status", table_name="jobs")
    op.create_index("ix_jobs_status_kind", "jobs", ["status", "kind"])

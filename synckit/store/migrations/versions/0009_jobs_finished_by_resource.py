"""jobs: finished jobs of a resource, newest first (the console's tenant pages)

``ix_jobs_finished_by_resource`` on ``(resource_key, id)`` holds the finished jobs that
have a resource key, so a tenant's recent cycles and its job list read that tenant's rows
newest first instead of walking a million jobs for a few of theirs. Unfinished jobs are
already indexed by resource (``ix_jobs_lane_due``, ``ix_jobs_running``). Partial on the
finished states, the index is never a candidate for the hot queries on pending and
running jobs (their predicates do not imply its), and a job enters it once, when it ends.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# As in synckit.web.queries.FINISHED, frozen here: a migration must not change with later
# code. A planner uses a partial index only when the query visibly implies its predicate.
_FINISHED = "status IN ('succeeded', 'dead', 'cancelled', 'discarded') AND resource_key IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_jobs_finished_by_resource",
        "jobs",
        ["resource_key", "id"],
        unique=False,
        postgresql_where=sa.text(_FINISHED),
        sqlite_where=sa.text(_FINISHED),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_by_resource", table_name="jobs")

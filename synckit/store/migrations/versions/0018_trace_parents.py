"""trace parents: jobs.trace_parent, outbox.trace_parent

The W3C ``traceparent`` of the span a job or an outbox message was made in (when
OpenTelemetry tracing is on, :mod:`synckit.tracing`): the job's span continues that trace
and links to it; the message is published with it in its ``traceparent`` header.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("trace_parent", sa.String(length=64), nullable=True))
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("trace_parent", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("trace_parent")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("trace_parent")

"""poll ticks per tenant and stream, and the scheduler's marker on connections

``poll_ticks`` holds one tick per (tenant, stream), indexed by ``next_tick_at`` so the
scheduler reads only what is due, and deleted with its tenant (foreign key, cascade).
``connections.poll_spec`` records what the scheduler last saw of a tenant; the partial
index ``ix_connections_unscheduled`` holds the tenants it has not seen as they are now.

The tenants' ticks in ``cron_ticks`` (``poll:<tenant>:<stream>``) are dropped: every
tenant starts unscheduled, so each is polled once soon after the upgrade and then on its
schedule.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# As in schema.UNSCHEDULED, frozen here: a migration must not change with later code.
_UNSCHEDULED = (
    "poll_spec IS NULL OR poll_spec <> "
    "CASE WHEN status = 'active' THEN COALESCE(schedule, '') ELSE '-' END"
)


def _ts(name: str, nullable: bool = True) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, synckit.store.tables.UTCDateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    with op.batch_alter_table("connections", schema=None) as batch_op:
        batch_op.add_column(sa.Column("poll_spec", sa.String(length=200), nullable=True))
    op.create_index(
        "ix_connections_unscheduled",
        "connections",
        ["connector"],
        unique=False,
        postgresql_where=sa.text(_UNSCHEDULED),
        sqlite_where=sa.text(_UNSCHEDULED),
    )
    op.create_table(
        "poll_ticks",
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("stream", sa.String(length=200), nullable=False),
        sa.Column("connector", sa.String(length=200), nullable=False),
        _ts("next_tick_at", nullable=False),
        _ts("last_tick_at"),
        sa.ForeignKeyConstraint(
            ["tenant"],
            ["connections.tenant"],
            name=op.f("fk_poll_ticks_tenant_connections"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant", "stream", name=op.f("pk_poll_ticks")),
    )
    op.create_index("ix_poll_ticks_next_tick_at", "poll_ticks", ["next_tick_at"], unique=False)
    op.execute("DELETE FROM cron_ticks WHERE name LIKE 'poll:%'")


def downgrade() -> None:
    op.drop_index("ix_poll_ticks_next_tick_at", table_name="poll_ticks")
    op.drop_table("poll_ticks")
    op.drop_index("ix_connections_unscheduled", table_name="connections")
    with op.batch_alter_table("connections", schema=None) as batch_op:
        batch_op.drop_column("poll_spec")

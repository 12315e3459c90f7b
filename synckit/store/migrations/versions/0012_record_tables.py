"""record_tables: the records tables synckit owns, and their change sequences

One row per table created from a stream's ``Records`` declaration by ``synckit db
upgrade --app``: its columns as created (``spec``) and ``last_seq``, the table's change
sequence, advanced under the row's lock in each page's transaction.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import synckit.store.tables

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "record_tables",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("connector", sa.String(length=200), nullable=False),
        sa.Column("stream", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", synckit.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", synckit.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_record_tables")),
    )


def downgrade() -> None:
    # The records tables themselves are the app's data: they are left as they are.
    op.drop_table("record_tables")

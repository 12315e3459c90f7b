"""learned rate columns on resources

A tenant whose API declares no limit and answers 429s with no wait gets a learnt request
rate (additive increase, multiplicative decrease: ``synckit.errors.pace``), shared by
every worker through its ``resources`` row as a declared rate's schedule is:
``learned_rate`` (requests a second; NULL: nothing learnt), ``learned_peak`` (the rate
that met the last cut) and ``learned_cut_at``. New rows and existing ones start with
nothing learnt.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("resources", sa.Column("learned_rate", sa.Float(), nullable=True))
    op.add_column("resources", sa.Column("learned_peak", sa.Float(), nullable=True))
    op.add_column(
        "resources",
        sa.Column("learned_cut_at", synckit.store.tables.UTCDateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    # No index on them: SQLite (3.35+) drops the columns in place.
    for column in ("learned_cut_at", "learned_peak", "learned_rate"):
        op.execute(f"ALTER TABLE resources DROP COLUMN {column}")

"""pending authorizations of the connect flow

One row per consent URL handed out (``begin_authorization``): the ``state`` it carries,
the tenant, the sealed PKCE verifier, the redirect URI and when it expires; ``used_at``
is set by the one callback that completes it, so a replayed callback is refused.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = True) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, synckit.store.tables.UTCDateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "pending_authorizations",
        sa.Column("state", sa.String(length=100), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("verifier", sa.LargeBinary(), nullable=False),
        sa.Column("redirect_uri", sa.String(length=1000), nullable=False),
        _ts("expires_at", nullable=False),
        _ts("used_at"),
        _ts("created_at", nullable=False),
        sa.PrimaryKeyConstraint("state", name=op.f("pk_pending_authorizations")),
    )
    op.create_index(
        "ix_pending_authorizations_tenant", "pending_authorizations", ["tenant"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_pending_authorizations_tenant", table_name="pending_authorizations")
    op.drop_table("pending_authorizations")

"""alerts.lease_token: alert delivery holds its rows under the one lease (store/leases.py)

An evaluator that takes alerts for delivery writes a lease token with the lease's end
(``lease_token``, beside the existing ``lease_expires_at``), and notes the outcome only
on the rows its token still holds: an evaluator whose lease ran out and whose alerts
another evaluator took over cannot finish them. Rows leased before the upgrade carry no
token and are free to take once their lease ends, as before.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("lease_token", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("lease_token")

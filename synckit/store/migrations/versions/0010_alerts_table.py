"""alerts: a table of their own instead of succeeded ``jobs`` rows

Alerts were recorded as ``jobs`` rows of kind ``synckit.alert_record`` (status
``succeeded``, the alert as JSON in ``payload``, the sinks that took it in
``payload._delivered``, ``unique_key`` ``alert:<rule>|<subject>|<window>``). They move to
``alerts``: one row per de-duplication key (unique), with the alert's fields as columns,
``ix_alerts_fired_at`` for the recent ones and the partial ``ix_alerts_unfinished`` for the
deliveries still owed.

Every record whose payload is a JSON object naming a rule and a subject moves, with its
delivery state (which sinks took it, attempts, last error, lease, finished or not), and
is deleted from ``jobs``; of two records with one key (which the old code never wrote)
the older is kept. A row of that kind that is not such a record stays in ``jobs`` as it
is, so nothing is lost. Downgrading writes the alerts back as such rows.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import synckit.store.tables

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Frozen here: a migration must not change with later code.
_KIND = "synckit.alert_record"
_COLUMNS = (
    "dedupe_key, rule, subject, window_key, severity, tenant, connector, message, details,"
    " fired_at, recorded_at, delivered, attempts, last_error, lease_expires_at, finished_at"
)
_SEVERITIES = "('info', 'warning', 'critical')"

# PostgreSQL: payload is JSONB, so always JSON; ``->`` on a non-object is NULL.
_PG_RECORD = (
    f"kind = '{_KIND}' AND status = 'succeeded' AND unique_key LIKE 'alert:%'"
    " AND jsonb_typeof(payload) = 'object'"
    " AND jsonb_typeof(payload->'rule') = 'string'"
    " AND jsonb_typeof(payload->'subject') = 'string'"
)
_PG_MOVE = (
    f"INSERT INTO alerts ({_COLUMNS})"
    " SELECT substr(unique_key, 7), payload->>'rule', payload->>'subject',"
    " COALESCE(payload->>'window', ''),"
    f" CASE WHEN payload->>'severity' IN {_SEVERITIES} THEN payload->>'severity'"
    " ELSE 'warning' END,"
    " payload->>'tenant', payload->>'connector', COALESCE(payload->>'message', ''),"
    " CASE WHEN jsonb_typeof(payload->'details') = 'object' THEN payload->'details' END,"
    " run_at, created_at,"
    " CASE WHEN jsonb_typeof(payload->'_delivered') = 'object' THEN payload->'_delivered'"
    " ELSE '{}'::jsonb END,"
    " attempts, last_error, lease_expires_at, finished_at"
    f" FROM jobs WHERE {_PG_RECORD} ORDER BY id"
    " ON CONFLICT (dedupe_key) DO NOTHING"
)
_PG_BACK = (
    "INSERT INTO jobs (kind, payload, status, priority, attempts, max_attempts, run_at,"
    " unique_key, last_error, created_at, updated_at, finished_at, lease_expires_at)"
    f" SELECT '{_KIND}', jsonb_build_object('rule', rule, 'subject', subject,"
    " 'message', message,"
    " 'fired_at', to_char(fired_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
    " || '+00:00',"
    " 'window', window_key, 'severity', severity, 'tenant', tenant, 'connector', connector,"
    " 'details', COALESCE(details, '{}'::jsonb), '_delivered', delivered),"
    " 'succeeded', 0, attempts, 1, fired_at, 'alert:' || dedupe_key, last_error,"
    " recorded_at, recorded_at, finished_at, lease_expires_at"
    " FROM alerts ORDER BY id"
)

# SQLite: payload is text that may not be JSON; json_extract fails on such text, so every
# JSON function is reached only through json_valid (CASE evaluates lazily).
_SQLITE_RECORD = (
    f"kind = '{_KIND}' AND status = 'succeeded' AND unique_key LIKE 'alert:%'"
    " AND CASE WHEN json_valid(payload) THEN json_type(payload) = 'object'"
    " AND json_type(payload, '$.rule') = 'text' AND json_type(payload, '$.subject') = 'text'"
    " ELSE 0 END"
)
_SQLITE_MOVE = (
    f"INSERT INTO alerts ({_COLUMNS})"
    " SELECT substr(unique_key, 7), json_extract(payload, '$.rule'),"
    " json_extract(payload, '$.subject'),"
    " COALESCE(CAST(json_extract(payload, '$.window') AS TEXT), ''),"
    f" CASE WHEN json_extract(payload, '$.severity') IN {_SEVERITIES}"
    " THEN json_extract(payload, '$.severity') ELSE 'warning' END,"
    " CAST(json_extract(payload, '$.tenant') AS TEXT),"
    " CAST(json_extract(payload, '$.connector') AS TEXT),"
    " COALESCE(CAST(json_extract(payload, '$.message') AS TEXT), ''),"
    " CASE WHEN json_type(payload, '$.details') = 'object'"
    " THEN json_extract(payload, '$.details') END,"
    " run_at, created_at,"
    " CASE WHEN json_type(payload, '$._delivered') = 'object'"
    " THEN json_extract(payload, '$._delivered') ELSE '{}' END,"
    " attempts, last_error, lease_expires_at, finished_at"
    f" FROM jobs WHERE {_SQLITE_RECORD} ORDER BY id"
    " ON CONFLICT (dedupe_key) DO NOTHING"
)
_SQLITE_BACK = (
    "INSERT INTO jobs (kind, payload, status, priority, attempts, max_attempts, run_at,"
    " unique_key, last_error, created_at, updated_at, finished_at, lease_expires_at)"
    f" SELECT '{_KIND}', json_object('rule', rule, 'subject', subject, 'message', message,"
    " 'fired_at', replace(fired_at, ' ', 'T') || '+00:00',"
    " 'window', window_key, 'severity', severity, 'tenant', tenant, 'connector', connector,"
    " 'details', json(COALESCE(details, '{}')), '_delivered', json(delivered)),"
    " 'succeeded', 0, attempts, 1, fired_at, 'alert:' || dedupe_key, last_error,"
    " recorded_at, recorded_at, finished_at, lease_expires_at"
    " FROM alerts ORDER BY id"
)


def _json() -> sa.types.TypeEngine:  # type: ignore[type-arg]
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _ts(name: str, nullable: bool = True) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, synckit.store.tables.UTCDateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("dedupe_key", sa.String(length=300), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("window_key", sa.Text(), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=True),
        sa.Column("connector", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", _json(), nullable=True),
        _ts("fired_at", nullable=False),
        _ts("recorded_at", nullable=False),
        sa.Column("delivered", _json(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        _ts("lease_expires_at"),
        _ts("finished_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("dedupe_key", name="uq_alerts_dedupe_key"),
    )
    op.create_index("ix_alerts_fired_at", "alerts", ["fired_at", "id"], unique=False)
    op.create_index(
        "ix_alerts_unfinished",
        "alerts",
        ["id"],
        unique=False,
        postgresql_where=sa.text("finished_at IS NULL"),
        sqlite_where=sa.text("finished_at IS NULL"),
    )
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(_PG_MOVE if postgres else _SQLITE_MOVE)
    op.execute(f"DELETE FROM jobs WHERE {_PG_RECORD if postgres else _SQLITE_RECORD}")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(_PG_BACK if postgres else _SQLITE_BACK)
    op.drop_index("ix_alerts_unfinished", table_name="alerts")
    op.drop_index("ix_alerts_fired_at", table_name="alerts")
    op.drop_table("alerts")

"""lease columns on dead_letters, intents and outbox

One lease shape for the three tables whose rows a process holds while it works outside
any transaction (:mod:`synckit.store.leases`): ``lease_token`` (who holds the row) and
``lease_expires_at`` (until when). They replace two home-made leases and a missing one:

* ``dead_letters``: a replay claim wrote ``replaying:<token>`` into ``status_reason``.
  A pending row holding such a marker moves it here: the token (what follows the
  prefix), ``lease_expires_at`` = its ``next_retry_at`` (where the claim put the lease's
  end), and ``status_reason`` is cleared. A replay of the old code still running when
  this upgrade commits finds its marker gone, so its outcome is fenced off, and the row
  comes due again when the lease ends, as after a crash: nothing is lost.
* ``intents``: a run held a pending intent through ``result._lease`` (``owner``,
  ``until``). A readable lease moves here with its owner as the token and its end as is,
  and the key leaves ``result``; a lease whose end cannot be read is dropped, which
  expires it: the next run asks ``find`` before creating, so an expired lease is safe.
* ``outbox``: the relay held a batch in one transaction; there is no lease to move.

Downgrading writes the leases back where the old code looks for them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 02:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import synckit.store.tables

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_TABLES = ("dead_letters", "intents", "outbox")
# Frozen here: a migration must not change with later code.
_PREFIX = "replaying:"

_DLQ_UP = (
    f"UPDATE dead_letters SET lease_token = substr(status_reason, {len(_PREFIX) + 1}),"
    " lease_expires_at = next_retry_at, status_reason = NULL"
    f" WHERE status = 'pending' AND status_reason LIKE '{_PREFIX}%'"
)
_DLQ_DOWN = (
    f"UPDATE dead_letters SET status_reason = '{_PREFIX}' || lease_token,"
    " next_retry_at = lease_expires_at"
    " WHERE status = 'pending' AND lease_token IS NOT NULL"
)

# PostgreSQL: result is JSONB. The old code wrote ``until`` as datetime.isoformat() of a
# UTC time; anything else is left to expire.
_PG_LEASED = (
    "status = 'pending' AND jsonb_typeof(result) = 'object'"
    " AND jsonb_typeof(result->'_lease') = 'object'"
)
_PG_UNTIL = "result->'_lease'->>'until'"
_PG_INTENTS_UP = (
    "UPDATE intents SET"
    " lease_token = CASE WHEN jsonb_typeof(result->'_lease'->'owner') = 'string'"
    f" AND {_PG_UNTIL} ~ '^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9:.]+[+]00:00$'"
    " THEN left(result->'_lease'->>'owner', 100) END,"
    " lease_expires_at = CASE WHEN jsonb_typeof(result->'_lease'->'owner') = 'string'"
    f" AND {_PG_UNTIL} ~ '^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9:.]+[+]00:00$'"
    f" THEN CAST({_PG_UNTIL} AS timestamptz) END,"
    " result = result - '_lease'"
    f" WHERE {_PG_LEASED}"
)
_PG_INTENTS_DOWN = (
    "UPDATE intents SET result = COALESCE(result, '{}'::jsonb) || jsonb_build_object('_lease',"
    " jsonb_build_object('owner', lease_token, 'until',"
    " to_char(lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') || '+00:00'))"
    " WHERE status = 'pending' AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL"
    " AND (result IS NULL OR jsonb_typeof(result) = 'object')"
)

# SQLite: result is text that may not be JSON; every JSON function is reached only through
# json_valid (CASE evaluates lazily). Timestamps are stored as naive UTC text
# ("2026-11-26 02:30:00.123456").
_SQLITE_UNTIL = "json_extract(result, '$._lease.until')"
_SQLITE_READABLE = (
    "json_type(result, '$._lease.owner') = 'text'"
    f" AND json_type(result, '$._lease.until') = 'text'"
    f" AND {_SQLITE_UNTIL} GLOB"
    " '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'"
)
_SQLITE_LEASED = (
    "status = 'pending' AND CASE WHEN json_valid(result)"
    " THEN json_type(result) = 'object' AND json_type(result, '$._lease') IS NOT NULL"
    " ELSE 0 END"
)
_SQLITE_INTENTS_UP = (
    "UPDATE intents SET"
    f" lease_token = CASE WHEN {_SQLITE_READABLE}"
    " THEN substr(json_extract(result, '$._lease.owner'), 1, 100) END,"
    f" lease_expires_at = CASE WHEN {_SQLITE_READABLE}"
    f" THEN replace(substr({_SQLITE_UNTIL}, 1, length({_SQLITE_UNTIL}) - 6), 'T', ' ') END,"
    " result = json_remove(result, '$._lease')"
    f" WHERE {_SQLITE_LEASED}"
)
_SQLITE_INTENTS_DOWN = (
    "UPDATE intents SET result = json_set(COALESCE(result, '{}'), '$._lease',"
    " json_object('owner', lease_token, 'until',"
    " replace(lease_expires_at, ' ', 'T') || '+00:00'))"
    " WHERE status = 'pending' AND lease_token IS NOT NULL AND lease_expires_at IS NOT NULL"
    " AND (result IS NULL OR (json_valid(result) AND json_type(result) = 'object'))"
)


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("lease_token", sa.String(length=100), nullable=True))
        op.add_column(
            table,
            sa.Column(
                "lease_expires_at", synckit.store.tables.UTCDateTime(timezone=True), nullable=True
            ),
        )
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(_DLQ_UP)
    op.execute(_PG_INTENTS_UP if postgres else _SQLITE_INTENTS_UP)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(_DLQ_DOWN)
    op.execute(_PG_INTENTS_DOWN if postgres else _SQLITE_INTENTS_DOWN)
    # Outbox messages a relay holds come due when their lease ends (the claim moved
    # next_attempt_at there), which is all the old relay needs. The columns carry no
    # index, so SQLite (3.35+) drops them in place, without rebuilding the tables.
    for table in reversed(_TABLES):
        op.execute(f"ALTER TABLE {table} DROP COLUMN lease_expires_at")
        op.execute(f"ALTER TABLE {table} DROP COLUMN lease_token")

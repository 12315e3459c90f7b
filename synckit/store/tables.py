"""The whole synckit schema as SQLAlchemy Core tables, one definition for both engines.

Every timestamp is a timezone-aware UTC ``datetime`` in Python, whatever the engine
(:class:`UTCDateTime`). JSON columns are ``JSONB`` on PostgreSQL and JSON text on SQLite.
Indexes are named for the query they serve; the hot ones are partial so that finished
rows (the bulk of a long-lived table) never slow a claim.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is timezone-aware UTC in Python on every engine.

    PostgreSQL stores ``timestamptz``. SQLite has no time zones, so the value is stored
    as naive UTC text (fixed width, so text order is time order) and given back as UTC.
    Naive datetimes are refused: a naive value is ambiguous and a source of silent bugs.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: synckit timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        # SQLite: the stored text is ISO 8601 ("2026-11-22 03:04:05.678901"), which
        # datetime.fromisoformat parses in C; SQLAlchemy's own SQLite DATETIME parser is
        # a regular expression, several times slower, and claims read a timestamp per job.
        def process(value: Any) -> datetime | None:
            if value is None:
                return None
            if isinstance(value, str):
                parsed = datetime.fromisoformat(value)
            else:  # a number or a datetime from an adapter: not what synckit stores
                return self.process_result_value(_slow(value), dialect)
            if parsed.tzinfo is None:
                return parsed.replace(tzinfo=UTC)
            return parsed.astimezone(UTC)

        _slow = super().result_processor(dialect, coltype) or (lambda v: v)
        return process


class _JSONOrJSONB(TypeDecorator[Any]):
    """``JSON`` everywhere, ``JSONB`` on PostgreSQL (as ``JSON().with_variant(JSONB(),
    "postgresql")``), without importing the PostgreSQL dialect until a PostgreSQL engine
    uses the type: commands run on SQLite (``status``, ``jobs ls``) never load it."""

    impl = JSON
    cache_ok = True
    # As JSON's default (none_as_null=False): Python's None is stored as JSON null.
    should_evaluate_none = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


JSONType = _JSONOrJSONB()


def postgresql_partial_indexes() -> None:
    """Gives every partial index its predicate on PostgreSQL too: the same ``WHERE`` as
    on SQLite (the tables below state it once, as ``sqlite_where``). Called when a
    PostgreSQL engine is opened (``open_database``), since naming ``postgresql_where``
    in a table's definition imports the PostgreSQL dialect, which commands on SQLite have
    no use for. Idempotent."""
    for table in metadata.tables.values():
        for index in table.indexes:
            where = index.dialect_options["sqlite"]["where"]
            if where is not None:
                index.dialect_kwargs["postgresql_where"] = where


def dialect_insert(conn: Any) -> Any:
    """The ``insert`` of ``conn``'s dialect (the one with ``on_conflict_do_*``); the
    PostgreSQL dialect is imported on the first PostgreSQL use, never on SQLite."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        return insert
    return sqlite.insert


# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (and so auto-increment).
BigID = BigInteger().with_variant(Integer(), "sqlite")

PENDING, RUNNING = "pending", "running"


def _ts(name: str, **kw: Any) -> Column[datetime]:
    return Column(name, UTCDateTime(), **kw)


jobs = Table(
    "jobs",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("kind", String(200), nullable=False),
    Column("resource_key", String(200)),
    Column("payload", JSONType, nullable=False),
    # pending | running | succeeded | dead | cancelled | discarded
    Column("status", String(16), nullable=False),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default="5"),
    _ts("run_at", nullable=False),
    Column("unique_key", String(300)),
    Column("locked_by", String(100)),
    Column("claim_token", BigInteger),
    _ts("heartbeat_at"),
    _ts("lease_expires_at"),
    Column("last_error", Text),
    Column("error_class", String(32)),
    Column("errors", JSONType),
    Column("trace_id", String(64)),
    # The W3C traceparent of the span it was enqueued in (migration 0018, synckit.tracing).
    Column("trace_parent", String(64)),
    Column("recurring", String(200)),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
    _ts("started_at"),
    _ts("finished_at"),
    # Running jobs: in-flight counts per resource and lease rescue.
    Index(
        "ix_jobs_running",
        "resource_key",
        "lease_expires_at",
        sqlite_where=text("status = 'running'"),
    ),
    # One unfinished job per unique key.
    Index(
        "uq_jobs_unique_key_unfinished",
        "unique_key",
        unique=True,
        sqlite_where=text("status IN ('pending', 'running')"),
    ),
    # Kind first: an index led by status would win SQLite's planner for every claim
    # (``status = 'pending'``) and make it sort the whole backlog instead of walking
    # ix_jobs_due / ix_jobs_lane_due in order. Counting by status scans this one.
    Index("ix_jobs_kind_status", "kind", "status"),
    Index("ix_jobs_finished_at", "finished_at"),
)

# Due jobs without a resource key, in claim order (highest priority, then oldest). The
# partial predicate keeps the index as small as the backlog, however many finished rows
# the table holds.
Index(
    "ix_jobs_due",
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    sqlite_where=text("status = 'pending' AND resource_key IS NULL"),
)
# Due jobs of one resource lane, in claim order.
Index(
    "ix_jobs_lane_due",
    jobs.c.resource_key,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    sqlite_where=text("status = 'pending' AND resource_key IS NOT NULL"),
)
# Finished jobs of one resource, newest first (migration 0009: the console's tenant pages,
# predicate as synckit.store.jobs.admin._FINISHED_BY_RESOURCE). Partial on finished states,
# so the hot queries on pending and running jobs never consider it.
_FINISHED_IN_LANE = (
    "status IN ('succeeded', 'dead', 'cancelled', 'discarded') AND resource_key IS NOT NULL"
)
Index(
    "ix_jobs_finished_by_resource",
    jobs.c.resource_key,
    jobs.c.id,
    sqlite_where=text(_FINISHED_IN_LANE),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("tenant", String(200), nullable=False),
    Column("connector", String(200), nullable=False),
    Column("kind", String(200), nullable=False),
    Column("record_id", String(500), nullable=False),
    Column("job_id", BigInteger),
    Column("resource_key", String(200)),
    Column("payload", JSONType),
    Column("error_class", String(32), nullable=False),
    Column("error_message", Text, nullable=False),
    Column("traceback", Text),
    Column("history", JSONType),
    Column("trace_id", String(64)),
    Column("attempt_count", Integer, nullable=False, server_default="1"),
    Column("replay_attempts", Integer, nullable=False, server_default="0"),
    # pending | resolved | ignored | review
    Column("status", String(16), nullable=False),
    Column("status_reason", Text),
    _ts("first_failed_at", nullable=False),
    _ts("last_attempt_at", nullable=False),
    _ts("next_retry_at"),
    _ts("resolved_at"),
    # The lease (migration 0011, synckit.store.leases): who holds the row, until when.
    Column("lease_token", String(100)),
    _ts("lease_expires_at"),
    UniqueConstraint("tenant", "connector", "kind", "record_id", name="uq_dead_letters_record"),
    Index(
        "ix_dead_letters_due",
        "next_retry_at",
        "id",
        sqlite_where=text("status = 'pending'"),
    ),
    Index("ix_dead_letters_tenant_status", "tenant", "status", "error_class"),
    Index("ix_dead_letters_status_last", "status", "last_attempt_at"),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("connector", String(200), primary_key=True),
    Column("stream", String(200), primary_key=True),
    Column("cursor", JSONType),
    _ts("updated_at", nullable=False),
)

resources = Table(
    "resources",
    metadata,
    Column("resource_key", String(200), primary_key=True),
    # The API-wide resource whose breaker also gates this one (None for a global resource).
    Column("parent_key", String(200)),
    # closed | open | half_open
    Column("state", String(16), nullable=False, server_default="closed"),
    Column("consecutive_failures", Integer, nullable=False, server_default="0"),
    Column("reopen_count", Integer, nullable=False, server_default="0"),
    _ts("opened_at"),
    _ts("cooldown_until"),
    Column("probe_job_id", BigInteger),
    _ts("next_available_at"),
    Column("last_error_class", String(32)),
    Column("last_error", Text),
    # The breaker's failure-rate window (opened by a failure, see errors.breaker).
    _ts("window_start"),
    Column("window_calls", Integer, nullable=False, server_default="0"),
    Column("window_failures", Integer, nullable=False, server_default="0"),
    Column("max_in_flight", Integer),
    Column("rate_per_s", Float),
    Column("burst", Integer),
    Column("tokens", Float),
    _ts("tokens_at"),
    _ts("last_claimed_at"),
    _ts("updated_at", nullable=False),
    # Rate-limit events (migration 0005): a streak of rate limits that gave no wait grows
    # the default pace; requests sent before ``rate_limited_at`` belong to that event.
    Column("rate_limit_streak", Integer, nullable=False, server_default="0"),
    _ts("rate_limited_at"),
    # Why next_available_at is where it is ("Retry-After", "X-RateLimit-Reset", ...).
    Column("paced_reason", String(300)),
    # The quota the API last reported (X-RateLimit-*, IETF RateLimit): adaptive pacing.
    Column("quota_limit", Integer),
    Column("quota_remaining", Integer),
    _ts("quota_reset_at"),
    _ts("quota_at"),
    # When a claimed breaker probe is presumed lost (BreakerPolicy.probe_timeout).
    _ts("probe_expires_at"),
    # The lane's mark (migration 0008): NULL when it has no pending job, else no later than
    # its earliest pending job's run_at. Claims start from the marked lanes (see jobs.py).
    _ts("due_at"),
    # The request rate learnt for an API that declares none (migration 0013,
    # synckit.errors.pace.LearnedRate): requests a second (NULL: none learnt), the rate
    # that met the last cut, and when it was cut.
    Column("learned_rate", Float),
    Column("learned_peak", Float),
    _ts("learned_cut_at"),
)

# The marked lanes in fairness order (least recently claimed first, never claimed before
# all): a claim walks it and stops at its LIMIT, however many resources there are.
# PostgreSQL needs NULLS FIRST in the index to serve that order; SQLite sorts NULLs first
# anyway and has no NULLS FIRST in CREATE INDEX, so migration 0008 creates it without
# there (this definition is for PostgreSQL's DDL and for comparing schemas).
Index(
    "ix_resources_lanes",
    resources.c.last_claimed_at.asc().nulls_first(),
    sqlite_where=text("due_at IS NOT NULL"),
)

intents = Table(
    "intents",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("tenant", String(200), nullable=False),
    Column("connector", String(200), nullable=False),
    Column("intent_key", String(300), nullable=False),
    # pending | done
    Column("status", String(16), nullable=False),
    Column("fingerprint", String(128), nullable=False),
    Column("remote_id", String(500)),
    Column("result", JSONType),
    Column("attempts", Integer, nullable=False, server_default="0"),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
    # The lease (migration 0011, synckit.store.leases): who holds the row, until when.
    Column("lease_token", String(100)),
    _ts("lease_expires_at"),
    UniqueConstraint("tenant", "connector", "intent_key", name="uq_intents_key"),
)

#: The predicate of ``ix_connections_unscheduled``, spelt the same in the scheduler's
#: query (a planner uses a partial index only when the query visibly implies it).
UNSCHEDULED = (
    "poll_spec IS NULL OR poll_spec <> "
    "CASE WHEN status = 'active' THEN COALESCE(schedule, '') ELSE '-' END"
)

connections = Table(
    "connections",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("connector", String(200), nullable=False),
    Column("resource_key", String(200), nullable=False),
    Column("config", JSONType),
    Column("schedule", String(200)),
    Column("token_set", LargeBinary),
    # active | needs_reauth | paused
    Column("status", String(16), nullable=False, server_default="active"),
    Column("status_reason", Text),
    _ts("token_expires_at"),
    # The refresh lease (migration 0005): who is refreshing the token set, until when.
    Column("refresh_owner", String(100)),
    _ts("refresh_until"),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
    # What the scheduler last saw of the tenant (migration 0007): its schedule while
    # active, '-' while not, NULL before its ticks exist. A row whose marker differs from
    # what it would be now (added, paused, resumed, schedule changed) is in
    # ix_connections_unscheduled, so each scheduler run finds them without a scan.
    Column("poll_spec", String(200)),
    Index("ix_connections_resource_key", "resource_key"),
    Index(
        "ix_connections_unscheduled",
        "connector",
        sqlite_where=text(UNSCHEDULED),
    ),
)

# One tick per (tenant, stream) of a polling connector (migration 0007): the scheduler
# reads only the due ones, in next_tick_at order, and a tenant's ticks go with it.
poll_ticks = Table(
    "poll_ticks",
    metadata,
    Column(
        "tenant",
        String(200),
        ForeignKey("connections.tenant", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("stream", String(200), primary_key=True),
    Column("connector", String(200), nullable=False),
    _ts("next_tick_at", nullable=False),
    _ts("last_tick_at"),
    Index("ix_poll_ticks_next_tick_at", "next_tick_at"),
)

# The connect flow's consent URLs not yet completed (migration 0006): ``state`` is the
# key, the PKCE verifier is sealed like tokens, ``used_at`` makes a callback count once.
pending_authorizations = Table(
    "pending_authorizations",
    metadata,
    Column("state", String(100), primary_key=True),
    Column("tenant", String(200), nullable=False),
    Column("verifier", LargeBinary, nullable=False),
    Column("redirect_uri", String(1000), nullable=False),
    _ts("expires_at", nullable=False),
    _ts("used_at"),
    _ts("created_at", nullable=False),
    Index("ix_pending_authorizations_tenant", "tenant"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("topic", String(300), nullable=False),
    Column("key", String(300)),
    Column("payload", JSONType, nullable=False),
    Column("message_id", String(100), nullable=False, unique=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    # pending | published | failed
    Column("status", String(16), nullable=False, server_default="pending"),
    _ts("next_attempt_at", nullable=False),
    _ts("created_at", nullable=False),
    _ts("published_at"),
    # The lease (migration 0011, synckit.store.leases): who holds the row, until when.
    Column("lease_token", String(100)),
    _ts("lease_expires_at"),
    # The W3C traceparent of the span it was written in (migration 0018, synckit.tracing).
    Column("trace_parent", String(64)),
    Index(
        "ix_outbox_pending",
        "next_attempt_at",
        "id",
        sqlite_where=text("status = 'pending'"),
    ),
    # The relay's claim: pending messages in id order, and the first pending one of a key.
    Index(
        "ix_outbox_pending_id",
        "id",
        sqlite_where=text("status = 'pending'"),
    ),
    Index(
        "ix_outbox_pending_key",
        "key",
        "id",
        sqlite_where=text("status = 'pending'"),
    ),
)

audit_buckets = Table(
    "audit_buckets",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("connector", String(200), primary_key=True),
    _ts("minute", primary_key=True),
    Column("app_version", String(64), primary_key=True, server_default=""),
    Column("ok", Integer, nullable=False, server_default="0"),
    Column("failed", Integer, nullable=False, server_default="0"),
    Column("failed_by_class", JSONType),
    # Attempts that ended paced (migration 0019): neither successes nor failures.
    Column("paced", Integer, nullable=False, server_default="0"),
    Index("ix_audit_buckets_minute", "minute"),
)

# Alerts the rules fired (migration 0010; see synckit.runtime.observe.alerts): one row per rule,
# subject and window (``dedupe_key``), written undelivered before any sink is called.
# ``delivered`` maps each sink that took it to when; ``finished_at`` is set once every
# sink has it or delivery was given up, and a delivery in progress holds a lease.
alerts = Table(
    "alerts",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("dedupe_key", String(300), nullable=False),
    Column("rule", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("window_key", Text, nullable=False),
    Column("severity", String(16), nullable=False),
    Column("tenant", Text),
    Column("connector", Text),
    Column("message", Text, nullable=False),
    Column("details", JSONType),
    _ts("fired_at", nullable=False),
    _ts("recorded_at", nullable=False),
    Column("delivered", JSONType, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    # Delivery holds a row under the one lease (store/leases.py, migration 0017).
    _ts("lease_expires_at"),
    _ts("finished_at"),
    Column("lease_token", String(100)),
    # De-duplication: at most one row per rule, subject and window, whoever inserts it.
    UniqueConstraint("dedupe_key", name="uq_alerts_dedupe_key"),
    # Recent alerts, newest first (status, the console), and pruning by age.
    Index("ix_alerts_fired_at", "fired_at", "id"),
    # The deliveries still owed, however many finished alerts are kept.
    Index(
        "ix_alerts_unfinished",
        "id",
        sqlite_where=text("finished_at IS NULL"),
    ),
)

cron_ticks = Table(
    "cron_ticks",
    metadata,
    Column("name", String(200), primary_key=True),
    _ts("last_tick_at"),
    _ts("next_tick_at", nullable=False),
    Column("spec", String(200), nullable=False),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
)

#: The records tables synckit created from declarations (synckit.store.records): the
#: columns as created, and the table's change sequence (``last_seq``, taken under the
#: row's lock in a page's transaction, so ``_seq`` values commit in order).
record_tables = Table(
    "record_tables",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("connector", String(200), nullable=False),
    Column("stream", String(200), nullable=False),
    Column("spec", JSONType, nullable=False),
    Column("last_seq", BigInteger, nullable=False, server_default="0"),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
)


# Worker processes (migration 0014, synckit.store.workers): each registers when it
# starts and heartbeats; one silent for longer than ``heartbeat_seconds`` x
# ``LOST_AFTER_BEATS`` is lost.
workers = Table(
    "workers",
    metadata,
    Column("worker_id", String(200), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(64), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("heartbeat_seconds", Float, nullable=False),
    Column("in_flight", Integer, nullable=False, server_default="0"),
    _ts("started_at", nullable=False),
    _ts("last_seen_at", nullable=False),
    _ts("stopped_at"),
    Index("ix_workers_last_seen_at", "last_seen_at"),
)


#: The queue's depth, sampled once a minute by a worker (migration 0016,
#: synckit.store.queue_history): pending jobs by what they wait for, and running ones.
#: ``capped``: more pending jobs than a sample reads (the counts are of the first ones).
queue_samples = Table(
    "queue_samples",
    metadata,
    _ts("minute", primary_key=True),
    Column("ready", Integer, nullable=False),
    Column("scheduled", Integer, nullable=False),
    Column("retrying", Integer, nullable=False),
    Column("paced", Integer, nullable=False),
    Column("running", Integer, nullable=False),
    Column("capped", Boolean, nullable=False, server_default=text("false")),
)


#: The webhook inbox (migration 0015, synckit.store.webhooks): one row per provider event
#: of a tenant, stored before the delivery is answered 2xx. ``tenant`` is '' for an
#: orphan (verified, but naming no known tenant; ``claimed`` holds what it named).
#: status: pending | processed | failed | orphaned.
webhook_events = Table(
    "webhook_events",
    metadata,
    Column("id", BigID, primary_key=True, autoincrement=True),
    Column("connector", String(200), nullable=False),
    Column("tenant", String(200), nullable=False),
    Column("event_id", String(300), nullable=False),
    Column("status", String(16), nullable=False),
    Column("claimed", String(200)),
    Column("headers", JSONType, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("duplicates", Integer, nullable=False, server_default="0"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    _ts("received_at", nullable=False),
    _ts("processed_at"),
    Column("lease_token", String(100)),
    _ts("lease_expires_at"),
    UniqueConstraint("connector", "tenant", "event_id", name="uq_webhook_events_event"),
    Index(
        "ix_webhook_events_pending",
        "tenant",
        "id",
        sqlite_where=text("status = 'pending'"),
    ),
)

#: Deliveries refused (401), counted per connector and tenant ('' when none was named).
webhook_refusals = Table(
    "webhook_refusals",
    metadata,
    Column("connector", String(200), primary_key=True),
    Column("tenant", String(200), primary_key=True),
    Column("count", BigInteger, nullable=False, server_default="0"),
    Column("last_reason", Text),
    _ts("last_at", nullable=False),
)

#: When events last triggered a cycle of a tenant's stream (the coalescing window).
webhook_triggers = Table(
    "webhook_triggers",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("stream", String(200), primary_key=True),
    _ts("last_at", nullable=False),
)

#: A provider's webhook subscription for one tenant's stream (migration 0020,
#: synckit.store.subscriptions): its id at the provider, when it expires, and when the
#: runtime acts on it next (``next_at``: renew an active one, retry a pending, lapsed or
#: failed one). state: pending | active | lapsed | failed. Deleted with its tenant.
webhook_subscriptions = Table(
    "webhook_subscriptions",
    metadata,
    Column(
        "tenant",
        String(200),
        ForeignKey("connections.tenant", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("stream", String(200), primary_key=True),
    Column("connector", String(200), nullable=False),
    Column("subscription_id", String(500)),
    Column("state", String(16), nullable=False),
    _ts("expires_at"),
    _ts("renewed_at"),
    _ts("next_at", nullable=False),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    Column("last_error_class", String(64)),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
    Index("ix_webhook_subscriptions_next_at", "next_at"),
)

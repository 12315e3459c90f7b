"""synckit: keep data in sync with third-party APIs that fail, throttle and lose responses.

The public API. Write a :class:`Connector` (see ``docs/connectors.md``), put it in an
:class:`App`, add tenants, and run ``synckit worker --app module:app``. The job queue
underneath (:func:`enqueue`, :class:`Registry`, :class:`Worker`) is public too, for work
that is not a poll cycle.
"""

from synckit.app import App
from synckit.connectors.base import BearerToken, Connector, Page, RateLimit, Stream
from synckit.connectors.context import SyncContext
from synckit.connectors.intents import IntentConflict, IntentResult, RemoteRecord, run_intent
from synckit.connectors.oauth import OAuth2Auth, OAuth2Config, reauth
from synckit.connectors.secrets import TokenSet
from synckit.connectors.tenants import (
    Tenant,
    add_tenant,
    get_tenant,
    list_tenants,
    pause_tenant,
    remove_tenant,
    resume_tenant,
    update_tenant,
)
from synckit.errors import (
    BreakerPolicy,
    Classification,
    ClassifyRules,
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
    ErrorClass,
    NeedsReauth,
    PermanentError,
    RateLimited,
    RetryableError,
    RetryPolicy,
    SynckitError,
    classify,
    retry_delay,
    set_testing,
)
from synckit.runtime.db import Database, open_database
from synckit.runtime.handlers import Cancel, Discard, JobContext, Registry, Snooze
from synckit.runtime.jobs import JobSpec, enqueue, enqueue_many
from synckit.runtime.migrate import upgrade as migrate_database
from synckit.runtime.outbox import add as outbox_add
from synckit.runtime.worker import Worker

__all__ = [
    "App",
    "BearerToken",
    "BreakerPolicy",
    "Cancel",
    "Classification",
    "ClassifyRules",
    "ConfigurationError",
    "Connector",
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "Discard",
    "ErrorClass",
    "IntentConflict",
    "IntentResult",
    "JobContext",
    "JobSpec",
    "NeedsReauth",
    "OAuth2Auth",
    "OAuth2Config",
    "Page",
    "PermanentError",
    "RateLimit",
    "RateLimited",
    "Registry",
    "RemoteRecord",
    "RetryPolicy",
    "RetryableError",
    "Snooze",
    "Stream",
    "SyncContext",
    "SynckitError",
    "Tenant",
    "TokenSet",
    "Worker",
    "add_tenant",
    "classify",
    "enqueue",
    "enqueue_many",
    "get_tenant",
    "list_tenants",
    "migrate_database",
    "open_database",
    "outbox_add",
    "pause_tenant",
    "reauth",
    "remove_tenant",
    "resume_tenant",
    "retry_delay",
    "run_intent",
    "set_testing",
    "update_tenant",
]

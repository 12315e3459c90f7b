"""synckit: keep data in sync with third-party APIs that fail, throttle and lose responses.

The public API. Write a :class:`Connector` (see ``docs/connectors.md``), put it in an
:class:`App`, add tenants, and run ``synckit worker --app module:app``. The job queue
underneath (:func:`enqueue`, :class:`Registry`, :class:`Worker`) is public too, for work
that is not a poll cycle.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from synckit.app import App
    from synckit.connectors.auth import BearerToken, OAuth2, OAuth2Config
    from synckit.connectors.base import Connector, Page, RateLimit, Stream
    from synckit.connectors.context import SyncContext
    from synckit.connectors.incremental import (
        Incremental,
        ListingOrder,
        ListingOrderError,
        NewestFirstFeed,
        Watermark,
    )
    from synckit.connectors.intents import IntentConflict, IntentResult, RemoteRecord
    from synckit.connectors.paging import (
        CursorPaginator,
        IdCursorPaginator,
        LinkHeaderPaginator,
        NextUrlPaginator,
        OffsetPaginator,
        PageNumberPaginator,
        Paginator,
    )
    from synckit.connectors.records import Deleted, Records
    from synckit.connectors.webhooks import (
        GitHubSignature,
        GraphNotifications,
        StandardWebhooks,
        StripeSignature,
        TenantFromBody,
        TenantFromPath,
        WebhookEvent,
        Webhooks,
    )
    from synckit.errors import (
        ApiError,
        ApiResponse,
        BreakerPolicy,
        Classification,
        ClassifyRules,
        ConfigurationError,
        DatabaseError,
        DatabaseUnavailable,
        ErrorBody,
        ErrorClass,
        ErrorDescription,
        NeedsReauth,
        PacePolicy,
        PermanentError,
        RateLimited,
        RetryableError,
        RetryPolicy,
        SynckitError,
        classify,
        retry_delay,
        set_testing,
    )
    from synckit.runtime.authorize import begin_authorization, complete_authorization
    from synckit.runtime.handlers import Cancel, Discard, JobContext, Registry, Snooze
    from synckit.runtime.intents import run_intent
    from synckit.runtime.oauth import OAuth2Auth, reauth
    from synckit.runtime.outbox import add as outbox_add
    from synckit.runtime.secrets import TokenSet
    from synckit.runtime.tenants import (
        Tenant,
        add_tenant,
        get_tenant,
        list_tenants,
        pause_tenant,
        remove_tenant,
        resume_tenant,
        update_tenant,
    )
    from synckit.runtime.worker import Worker
    from synckit.store.db import Database, open_database
    from synckit.store.jobs import JobSpec, enqueue, enqueue_many
    from synckit.store.migrate import upgrade as migrate_database

# Names are imported on first use (PEP 562), so that `import synckit` (and every
# `synckit` command, which imports the package) does not pay for Alembic, authlib and
# the whole runtime up front.
_EXPORTS: dict[str, tuple[str, str]] = {
    "Watermark": ("synckit.connectors.incremental", "Watermark"),
    "Paginator": ("synckit.connectors.paging", "Paginator"),
    "PageNumberPaginator": ("synckit.connectors.paging", "PageNumberPaginator"),
    "OffsetPaginator": ("synckit.connectors.paging", "OffsetPaginator"),
    "NextUrlPaginator": ("synckit.connectors.paging", "NextUrlPaginator"),
    "LinkHeaderPaginator": ("synckit.connectors.paging", "LinkHeaderPaginator"),
    "Incremental": ("synckit.connectors.incremental", "Incremental"),
    "IdCursorPaginator": ("synckit.connectors.paging", "IdCursorPaginator"),
    "ListingOrder": ("synckit.connectors.incremental", "ListingOrder"),
    "ListingOrderError": ("synckit.connectors.incremental", "ListingOrderError"),
    "NewestFirstFeed": ("synckit.connectors.incremental", "NewestFirstFeed"),
    "CursorPaginator": ("synckit.connectors.paging", "CursorPaginator"),
    "App": ("synckit.app", "App"),
    "ApiError": ("synckit.errors", "ApiError"),
    "ApiResponse": ("synckit.errors", "ApiResponse"),
    "ErrorBody": ("synckit.errors", "ErrorBody"),
    "ErrorDescription": ("synckit.errors", "ErrorDescription"),
    "BearerToken": ("synckit.connectors.auth", "BearerToken"),
    "BreakerPolicy": ("synckit.errors", "BreakerPolicy"),
    "Cancel": ("synckit.runtime.handlers", "Cancel"),
    "Classification": ("synckit.errors", "Classification"),
    "ClassifyRules": ("synckit.errors", "ClassifyRules"),
    "ConfigurationError": ("synckit.errors", "ConfigurationError"),
    "Connector": ("synckit.connectors.base", "Connector"),
    "Database": ("synckit.store.db", "Database"),
    "DatabaseError": ("synckit.errors", "DatabaseError"),
    "DatabaseUnavailable": ("synckit.errors", "DatabaseUnavailable"),
    "Discard": ("synckit.runtime.handlers", "Discard"),
    "ErrorClass": ("synckit.errors", "ErrorClass"),
    "IntentConflict": ("synckit.connectors.intents", "IntentConflict"),
    "IntentResult": ("synckit.connectors.intents", "IntentResult"),
    "JobContext": ("synckit.runtime.handlers", "JobContext"),
    "JobSpec": ("synckit.store.jobs", "JobSpec"),
    "NeedsReauth": ("synckit.errors", "NeedsReauth"),
    "OAuth2Auth": ("synckit.runtime.oauth", "OAuth2Auth"),
    "OAuth2": ("synckit.connectors.auth", "OAuth2"),
    "OAuth2Config": ("synckit.connectors.auth", "OAuth2Config"),
    "PacePolicy": ("synckit.errors", "PacePolicy"),
    "Page": ("synckit.connectors.base", "Page"),
    "Records": ("synckit.connectors.records", "Records"),
    "Deleted": ("synckit.connectors.records", "Deleted"),
    "PermanentError": ("synckit.errors", "PermanentError"),
    "RateLimit": ("synckit.connectors.base", "RateLimit"),
    "RateLimited": ("synckit.errors", "RateLimited"),
    "Registry": ("synckit.runtime.handlers", "Registry"),
    "RemoteRecord": ("synckit.connectors.intents", "RemoteRecord"),
    "RetryPolicy": ("synckit.errors", "RetryPolicy"),
    "RetryableError": ("synckit.errors", "RetryableError"),
    "Snooze": ("synckit.runtime.handlers", "Snooze"),
    "Stream": ("synckit.connectors.base", "Stream"),
    "SyncContext": ("synckit.connectors.context", "SyncContext"),
    "SynckitError": ("synckit.errors", "SynckitError"),
    "Tenant": ("synckit.runtime.tenants", "Tenant"),
    "TokenSet": ("synckit.runtime.secrets", "TokenSet"),
    "Worker": ("synckit.runtime.worker", "Worker"),
    "add_tenant": ("synckit.runtime.tenants", "add_tenant"),
    "begin_authorization": ("synckit.runtime.authorize", "begin_authorization"),
    "complete_authorization": ("synckit.runtime.authorize", "complete_authorization"),
    "classify": ("synckit.errors", "classify"),
    "enqueue": ("synckit.store.jobs", "enqueue"),
    "enqueue_many": ("synckit.store.jobs", "enqueue_many"),
    "get_tenant": ("synckit.runtime.tenants", "get_tenant"),
    "list_tenants": ("synckit.runtime.tenants", "list_tenants"),
    "migrate_database": ("synckit.store.migrate", "upgrade"),
    "open_database": ("synckit.store.db", "open_database"),
    "outbox_add": ("synckit.runtime.outbox", "add"),
    "pause_tenant": ("synckit.runtime.tenants", "pause_tenant"),
    "reauth": ("synckit.runtime.oauth", "reauth"),
    "remove_tenant": ("synckit.runtime.tenants", "remove_tenant"),
    "resume_tenant": ("synckit.runtime.tenants", "resume_tenant"),
    "retry_delay": ("synckit.errors", "retry_delay"),
    "run_intent": ("synckit.runtime.intents", "run_intent"),
    "set_testing": ("synckit.errors", "set_testing"),
    "update_tenant": ("synckit.runtime.tenants", "update_tenant"),
    "GitHubSignature": ("synckit.connectors.webhooks", "GitHubSignature"),
    "GraphNotifications": ("synckit.connectors.webhooks", "GraphNotifications"),
    "StandardWebhooks": ("synckit.connectors.webhooks", "StandardWebhooks"),
    "StripeSignature": ("synckit.connectors.webhooks", "StripeSignature"),
    "TenantFromBody": ("synckit.connectors.webhooks", "TenantFromBody"),
    "TenantFromPath": ("synckit.connectors.webhooks", "TenantFromPath"),
    "WebhookEvent": ("synckit.connectors.webhooks", "WebhookEvent"),
    "Webhooks": ("synckit.connectors.webhooks", "Webhooks"),
}

__all__ = [
    "ApiError",
    "ApiResponse",
    "App",
    "BearerToken",
    "BreakerPolicy",
    "Cancel",
    "Classification",
    "ClassifyRules",
    "ConfigurationError",
    "Connector",
    "CursorPaginator",
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "Deleted",
    "Discard",
    "ErrorBody",
    "ErrorClass",
    "ErrorDescription",
    "GitHubSignature",
    "GraphNotifications",
    "IdCursorPaginator",
    "Incremental",
    "IntentConflict",
    "IntentResult",
    "JobContext",
    "JobSpec",
    "LinkHeaderPaginator",
    "ListingOrder",
    "ListingOrderError",
    "NeedsReauth",
    "NewestFirstFeed",
    "NextUrlPaginator",
    "OAuth2",
    "OAuth2Auth",
    "OAuth2Config",
    "OffsetPaginator",
    "PacePolicy",
    "Page",
    "PageNumberPaginator",
    "Paginator",
    "PermanentError",
    "RateLimit",
    "RateLimited",
    "Records",
    "Registry",
    "RemoteRecord",
    "RetryPolicy",
    "RetryableError",
    "Snooze",
    "StandardWebhooks",
    "Stream",
    "StripeSignature",
    "SyncContext",
    "SynckitError",
    "Tenant",
    "TenantFromBody",
    "TenantFromPath",
    "TokenSet",
    "Watermark",
    "WebhookEvent",
    "Webhooks",
    "Worker",
    "add_tenant",
    "begin_authorization",
    "classify",
    "complete_authorization",
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


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'synckit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""synckit: keep data in sync with third-party APIs that fail, throttle and lose responses.

The public API. Write a :class:`Connector` (see ``docs/connectors.md``), put it in an
:class:`App`, add tenants, and run ``synckit worker --app module:app``.
"""

from synckit.app import App
from synckit.connectors.base import BearerToken, Connector, Page, RateLimit, Stream
from synckit.connectors.context import SyncContext
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

__all__ = [
    "App",
    "BearerToken",
    "Connector",
    "Page",
    "RateLimit",
    "Stream",
    "SyncContext",
    "Tenant",
    "add_tenant",
    "get_tenant",
    "list_tenants",
    "pause_tenant",
    "remove_tenant",
    "resume_tenant",
    "update_tenant",
]

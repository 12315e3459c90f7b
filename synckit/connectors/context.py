""":class:`SyncContext`: what a connector's hooks receive (the interface).

``ctx.http`` is the tenant's ``httpx.AsyncClient`` (base URL, auth, timeouts, pacing and
error classification applied to every request); ``ctx.log`` a structlog logger bound to
tenant, connector, stream and trace id; ``ctx.intent(...)`` an intent-first create;
``ctx.stream`` the stream being polled.

This module is the interface only: connectors are written against it, and it imports
nothing of the runtime or the store. The runtime implements it
(:class:`synckit.runtime.sync.context.RuntimeContext`, opened by
:func:`synckit.runtime.sync.context.open_context`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from synckit.connectors.auth import OAuth2
    from synckit.connectors.base import Connector
    from synckit.connectors.intents import Create, Find, IntentResult

__all__ = ["SyncContext"]


class SyncContext(abc.ABC):
    """What ``poll()`` and ``handle()`` get. One per tenant and cycle (or replay).

    ``record_id`` is set in the copy ``handle()`` receives for one record, whose ``log``
    is bound to it too.
    """

    connector: Connector[Any]
    tenant: str
    stream: str
    resource_key: str
    trace_id: str
    log: Any
    http: httpx.AsyncClient
    record_id: str | None
    #: The runtime's database handle (a :class:`synckit.store.db.Database`), for code
    #: that calls the runtime's own functions with it; typed ``Any`` so that this
    #: interface depends on no store.
    db: Any

    @property
    def connector_name(self) -> str:
        return self.connector.name

    @abc.abstractmethod
    def for_record(self, record_id: str) -> SyncContext:
        """This context for the handling of one record: ``record_id`` set and logged."""

    @abc.abstractmethod
    async def intent(
        self,
        key: str,
        *,
        create: Create,
        find: Find | None = None,
        request: Any = None,
        idempotency_header: str | None = None,
    ) -> IntentResult:
        """Create something on the API at most once per ``key`` for this tenant.

        The intent is stored before ``create`` runs; a finished one returns its stored
        result; an unfinished one asks ``find`` first. ``request`` is what the create
        sends: its fingerprint detects a key reused for a different request.
        """

    @abc.abstractmethod
    def auth_for(self, declaration: OAuth2) -> httpx.Auth:
        """The :class:`httpx.Auth` that fulfils ``declaration`` for this tenant."""

"""Audit counts written as the worker writes them (``record_audit_sync``, inside the
transaction that records outcomes), from a test's async connection."""

from __future__ import annotations

from typing import Any

from synckit.store.audit import record_audit_sync


async def record_audit(conn: Any, *args: Any, **kwargs: Any) -> None:
    """:func:`record_audit_sync` on the async connection ``conn``."""
    await conn.run_sync(lambda c: record_audit_sync(c, *args, **kwargs))

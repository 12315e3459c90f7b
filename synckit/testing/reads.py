"""Reads for a connector author's assertions: what a test ran left in the database."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synckit.store.db import Database
    from synckit.store.dead_letters.rows import DeadLetter

__all__ = ["dead_letters"]


async def dead_letters(
    db: Database,
    *,
    tenant: str | None = None,
    connector: str | None = None,
    kind: str | None = None,
    status: str | None = None,
    error_class: str | None = None,
) -> list[DeadLetter]:
    """The dead letters matching every filter given, oldest first, tracebacks included.

    Each is a :class:`~synckit.store.dead_letters.rows.DeadLetter`: ``record_id``,
    ``error_class``, ``error_message`` (the provider's own message when its error body had
    one), ``payload``, ``status``, ``traceback``... ``kind`` ending in ``*`` matches by
    prefix (``record:*``). For example::

        (row,) = await dead_letters(synckit_db, tenant="acme")
        assert row.error_class == "validation"
        assert "card_declined" in row.error_message
    """
    from synckit.store.dead_letters import reads as dlq_reads
    from synckit.store.dead_letters import rows as dlq_rows

    flt = dlq_rows.DlqFilter(
        tenants=(tenant,) if tenant is not None else (),
        connectors=(connector,) if connector is not None else (),
        kinds=(kind,) if kind is not None else (),
        statuses=(status,) if status is not None else (),
        error_classes=(error_class,) if error_class is not None else (),
    )
    return [row async for row in dlq_reads.iter_rows(db, flt, full=True)]

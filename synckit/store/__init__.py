"""Storage: the tables and the named operations on them.

``store`` is the one package that imports the table definitions
(:mod:`synckit.store.tables`) or SQLAlchemy; the rest of synckit calls its operations, one
module per table family (``jobs``, ``resources``, ``connections``, ``dead_letters``,
``checkpoints``, ``intents``, ``outbox``, ``audit``, ``ticks``, ``alerts``), and the
operators' reads (``views``, ``console``, ``pages``). ``tests/unit/test_layers.py`` holds
every other module to it.
"""

from typing import TYPE_CHECKING, Any

from synckit.store import lazy_asyncio

# SQLAlchemy's asyncio extension without the ORM it does not need (start-up, issue 35).
lazy_asyncio.install()

if TYPE_CHECKING:
    from synckit.store.tables import UTCDateTime

# The one column type of the store's that code outside it may use on tables of its own
# (the Graph mail example's mail_messages): timezone-aware UTC on both engines. Loaded on
# first use (PEP 562), so that importing a module of the store that needs no table
# (``synckit.store.urls``) does not import SQLAlchemy.
__all__ = ["UTCDateTime"]


def __getattr__(name: str) -> Any:
    if name != "UTCDateTime":
        raise AttributeError(f"module 'synckit.store' has no attribute {name!r}")
    from synckit.store.tables import UTCDateTime

    return UTCDateTime

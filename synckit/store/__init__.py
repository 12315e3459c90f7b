"""Storage: the tables and the named operations on them.

``store`` is the one package that imports the table definitions
(:mod:`synckit.store.tables`) or SQLAlchemy; the rest of synckit calls its operations, one
module per table family (``jobs``, ``resources``, ``connections``, ``dead_letters``,
``checkpoints``, ``intents``, ``outbox``, ``audit``, ``ticks``, ``alerts``), and the
operators' reads (``views``, ``console``, ``pages``). ``tests/unit/test_layers.py`` holds
every other module to it.
"""

# The one column type of the store's that code outside it may use on tables of its own
# (the Graph mail example's mail_messages): timezone-aware UTC on both engines.
from synckit.store.tables import UTCDateTime

__all__ = ["UTCDateTime"]

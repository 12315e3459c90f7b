"""Storage: the tables and the operations on them.

``store`` is meant to be the one package that imports the table definitions
(:mod:`synckit.store.tables`); the rest of synckit calls its named operations. The move is
under way: ``tests/unit/test_layers.py`` lists the modules outside it that still build SQL.
"""

# The one column type of the store's that code outside it may use on tables of its own
# (the Graph mail example's mail_messages): timezone-aware UTC on both engines.
from synckit.store.tables import UTCDateTime

__all__ = ["UTCDateTime"]

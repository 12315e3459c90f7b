"""Storage: the tables and the operations on them.

``store`` is meant to be the one package that imports the table definitions
(:mod:`synckit.store.tables`); the rest of synckit calls its named operations. The move is
under way: ``tests/unit/test_layers.py`` lists the modules outside it that still build SQL.
"""

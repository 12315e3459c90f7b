"""Which engines a test runs on.

Storage behaviour runs on both: a test taking ``db``, ``db_url`` or ``migrated_url`` runs
once on SQLite and once on PostgreSQL. A test of what does not depend on the engine
(argument checks, one-line refusals, logging, signals, where ``/metrics`` listens) still
needs a migrated database, but one engine shows it: ``@sqlite_only`` runs it on SQLite
alone, which keeps the suite well under its time limit.
"""

from __future__ import annotations

import pytest

sqlite_only = pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)

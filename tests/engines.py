"""Which engines a test runs on.

Storage behaviour runs on both: a test taking ``db``, ``db_url`` or ``migrated_url`` runs
once on SQLite and once on PostgreSQL. ``@sqlite_only`` runs a test on SQLite alone, which
keeps the suite well under its time limit, for two kinds of test:

* what does not depend on the engine (argument checks, one-line refusals, logging,
  signals, where ``/metrics`` listens), though it needs a migrated database;
* a command's end-to-end test whose storage operations are tested on both engines in
  ``tests/integration`` (``test_dlq_store.py``, ``test_outbox.py``, ``test_web.py``,
  ``test_queue.py``, ``test_poll.py``...). Every command family keeps end-to-end cases on
  PostgreSQL too (``jobs ls`` paging, ``dlq show``/``replay``/streaming, the static-key
  tenant's 401 → ``set-config`` flow, ``outbox ls``, ``status``, the corrupt-row reads).
"""

from __future__ import annotations

import pytest

sqlite_only = pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)

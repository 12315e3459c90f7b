"""The test servers: where PostgreSQL is, whether it can be reached, and whether the
servers (PostgreSQL, RabbitMQ) are required: a test that cannot reach one is skipped with
the reason, or fails under ``SYNCKIT_REQUIRE_SERVICES=1`` (CI).

A module of its own, not ``conftest``: ``tests/e2e/conftest.py`` is also a module named
``conftest``, so ``from conftest import ...`` found whichever was imported first.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy.engine import make_url

REQUIRE_SERVICES = os.environ.get("SYNCKIT_REQUIRE_SERVICES") == "1"


def service_unavailable(name: str, reason: str) -> None:
    """Skip the test, or fail it when the services are required (CI)."""
    message = f"{name} unavailable: {reason}"
    if REQUIRE_SERVICES:
        pytest.fail(message + " (SYNCKIT_REQUIRE_SERVICES=1)")
    pytest.skip(message)


PG_URL = os.environ.get("SYNCKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _tcp_reachable(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc}"


_pg_problem: list[str | None] = []


def postgres_problem() -> str | None:
    """Why PostgreSQL cannot be used, or None (checked once per session)."""
    if not _pg_problem:
        url = make_url(PG_URL)
        _pg_problem.append(_tcp_reachable(url.host or "127.0.0.1", url.port or 5432))
    return _pg_problem[0]


class _Admin:
    """One connection to PostgreSQL per test process for the fixtures' administration
    (each test's schema made, filled from the template and dropped), on an event loop
    of its own in a thread, so that the synchronous fixtures can use it between tests'
    loops. It replaced an engine made, connected and disposed of for each statement,
    three times per PostgreSQL test. A connection that broke is opened again once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Any = None

    def run(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        """``call(connection)``'s result (an asyncpg connection)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                runs = threading.Thread(target=self._loop.run_forever, name="pg-admin", daemon=True)
                runs.start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(self._call(call), loop).result()

    async def _call(self, call: Callable[[Any], Awaitable[Any]]) -> Any:
        import asyncpg

        for attempt in (1, 2):
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(PG_URL.split("?")[0])
            try:
                return await call(self._conn)
            except (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
                if attempt == 2 or not self._conn.is_closed():
                    raise
        raise AssertionError("unreachable")


_admin = _Admin()

#: The system catalogs each test schema's tables, indexes, sequences, defaults, functions
#: and triggers are written to, and deleted from when it is dropped: a run makes and drops
#: thousands, which leaves millions of dead catalog rows.
CHURNED_CATALOGS = (
    "pg_attribute", "pg_class", "pg_depend", "pg_type", "pg_constraint", "pg_index",
    "pg_attrdef", "pg_sequence", "pg_namespace", "pg_proc", "pg_trigger", "pg_rewrite",
    "pg_description", "pg_init_privs",
)  # fmt: skip


def vacuum_catalogs() -> str | None:
    """VACUUM the catalogs the suite's schemas churned (:data:`CHURNED_CATALOGS`): None, or
    why it could not. Autovacuum would, where it runs; with it off (as on a CI server:
    this machine's) the dead rows only grew, and each run was slower than the last
    (pg_attribute 652 MB with 3.1 million dead rows after a day's runs; pytest 653, 716,
    then 788 s for the same tests). Only a superuser or the catalogs' owner may vacuum
    them; for anyone else PostgreSQL skips them with a warning."""
    names = ", ".join(f"pg_catalog.{c}" for c in CHURNED_CATALOGS)
    try:
        pg_execute(f"VACUUM {names}")
    except Exception as exc:  # the run's outcome is the tests', not this clean-up's
        return f"{type(exc).__name__}: {exc}"
    return None


def pg_execute(sql: str) -> None:
    """Run ``sql`` (one or many statements; no parameters) on PostgreSQL, committed."""
    _admin.run(lambda conn: conn.execute(sql))


def pg_fetchval(sql: str) -> Any:
    """The first value of ``sql``'s first row, on PostgreSQL."""
    return _admin.run(lambda conn: conn.fetchval(sql))


def pg_fetchrow(sql: str, *args: Any) -> tuple[Any, ...]:
    """The first row of ``sql`` (parameters ``$1``... from ``args``), on PostgreSQL."""
    return tuple(_admin.run(lambda conn: conn.fetchrow(sql, *args)))


#: What a migrated schema's structure is, as one digest: its relations (tables, indexes,
#: sequences, views) and their columns, defaults, constraints, functions, triggers, types
#: and index definitions; and how many planner statistics its tables have. Every lookup
#: goes by an index: the schema's own objects are found by their dependency on it
#: (pg_depend), indexes, constraints and triggers by their table, row and array types by
#: their relation. Filtering pg_class, pg_type or pg_constraint by namespace scans the
#: whole catalog, which grows through a run (thousands of schemas made and dropped): that
#: took ~19 ms a call, the costliest statement of the run.
FINGERPRINT = """
WITH ns AS (SELECT $1::text::regnamespace::oid AS oid),
owned AS (
  SELECT d.classid, d.objid FROM pg_depend d, ns
   WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = ns.oid
),
tabs AS (
  SELECT c.* FROM pg_class c JOIN owned o ON o.classid = 'pg_class'::regclass AND c.oid = o.objid
),
types AS (
  SELECT y.typname, y.typarray FROM tabs t JOIN pg_type y ON y.oid = t.reltype
  UNION ALL
  SELECT y.typname, y.typarray
    FROM owned o JOIN pg_type y ON o.classid = 'pg_type'::regclass AND y.oid = o.objid
),
rels AS (
  SELECT oid, relname, relkind, relnatts, reltype FROM tabs
  UNION ALL
  SELECT c.oid, c.relname, c.relkind, c.relnatts, c.reltype
    FROM pg_index i JOIN tabs t ON i.indrelid = t.oid JOIN pg_class c ON c.oid = i.indexrelid
)
SELECT md5(string_agg(item, ',' ORDER BY item)),
       (SELECT count(*) FROM pg_statistic s JOIN rels r ON s.starelid = r.oid)
FROM (
  SELECT 'r:' || relname || ':' || relkind::text || ':' || relnatts AS item FROM rels
  UNION ALL
  SELECT 'a:' || r.relname || '.' || a.attname || ':' || a.atttypid || ':' || a.attnotnull
         || ':' || a.atthasdef || ':' || a.attisdropped
    FROM pg_attribute a JOIN rels r ON r.oid = a.attrelid
   WHERE a.attnum > 0
  UNION ALL
  SELECT 'c:' || conname || ':' || contype::text || ':' || md5(pg_get_constraintdef(k.oid))
    FROM pg_constraint k JOIN tabs t ON k.conrelid = t.oid
  UNION ALL
  SELECT 'c:' || conname || ':' || contype::text || ':' || md5(pg_get_constraintdef(k.oid))
    FROM pg_constraint k JOIN owned o ON o.classid = 'pg_type'::regclass AND k.contypid = o.objid
  UNION ALL
  SELECT 'p:' || proname || ':' || md5(prosrc)
    FROM pg_proc p JOIN owned o ON o.classid = 'pg_proc'::regclass AND p.oid = o.objid
  UNION ALL
  SELECT 't:' || g.tgname FROM pg_trigger g JOIN tabs t ON g.tgrelid = t.oid
  UNION ALL
  SELECT 'y:' || typname FROM types
  UNION ALL
  SELECT 'y:' || y.typname FROM types t JOIN pg_type y ON y.oid = t.typarray
  UNION ALL
  SELECT 'i:' || r.relname || ':' || md5(pg_get_indexdef(r.oid)) FROM rels r WHERE r.relkind = 'i'
) items
"""


def fingerprint(schema: str) -> tuple[str, int]:
    """:data:`FINGERPRINT` of ``schema``. The catalogs' planner statistics are those of
    the last VACUUM (autovacuum may be off, as on the CI machine), so the planner would
    scan a catalog it believes small: sequential scans are turned off for it."""

    async def read(conn: Any) -> tuple[str, int]:
        async with conn.transaction():
            await conn.execute("SET LOCAL enable_seqscan = off")
            digest, stats = await conn.fetchrow(FINGERPRINT, schema)
        return digest, stats

    result: tuple[str, int] = _admin.run(read)
    return result


#: A schema's migration version(s), as one text.
_VERSION = "SELECT string_agg(version_num, ',') FROM {schema}.alembic_version"


class SchemaPool:
    """The migrated PostgreSQL schemas of this test process, reused from test to test.

    Making each test's schema (``CREATE SCHEMA`` and the template's DDL replayed) and
    dropping it afterwards cost PostgreSQL more than most tests that use it. A schema
    given back is emptied instead and handed to the next test, but only if the test left
    it as the template made it:

    * the same structure (:data:`FINGERPRINT`, against the first schema's just after its
      DDL) and migration version;
    * no planner statistics and no table ever vacuumed (a test's ``ANALYZE``, or
      autovacuum's), which would change the next test's plans;
    * at most :data:`REUSE_ROWS` rows in all: it is emptied by ``DELETE`` (its sequences
      restarted), which costs a millisecond where ``TRUNCATE``'s new files cost
      100-200 ms, but leaves dead rows behind.

    Any other schema is dropped, as is one whose test failed before it was migrated.
    """

    #: The most rows a schema may hold to be emptied and reused rather than dropped.
    REUSE_ROWS = 2000

    def __init__(self) -> None:
        self._free: list[str] = []
        #: Every schema this pool made and has not dropped (free or in a test's hands).
        self._made: set[str] = set()
        self._migrated: set[str] = set()
        self._reference: str | None = None
        self._version: str | None = None
        #: The tables a reset empties (every one but alembic_version), and the sequences
        #: it restarts, with their start values.
        self._tables: list[str] = []
        self._sequences: list[tuple[str, int]] = []

    def take(self) -> str:
        if self._free:
            return self._free.pop()
        schema = f"t_{uuid.uuid4().hex[:16]}"
        pg_execute(f"CREATE SCHEMA {schema}")
        self._made.add(schema)
        return schema

    def migrated(self, schema: str) -> bool:
        return schema in self._migrated

    def filled(self, schema: str) -> None:
        """``schema`` holds the template's DDL now (the first one: the reference)."""
        self._migrated.add(schema)
        if self._reference is None:
            self._reference, _ = fingerprint(schema)
            self._version = pg_fetchval(_VERSION.format(schema=schema))
            tables = pg_fetchval(
                "SELECT string_agg(quote_ident(tablename), ',') FROM pg_tables"
                f" WHERE schemaname = '{schema}' AND tablename <> 'alembic_version'"
            )
            self._tables = tables.split(",")
            sequences = pg_fetchval(
                "SELECT string_agg(quote_ident(sequencename) || ' ' || start_value, ',')"
                f" FROM pg_sequences WHERE schemaname = '{schema}'"
            )
            pairs = (item.split(" ") for item in (sequences or "").split(",") if item)
            self._sequences = [(name, int(start)) for name, start in pairs]

    def give_back(self, schema: str) -> None:
        if schema in self._migrated and self._reference is not None and self._reusable(schema):
            deletes = "; ".join(f"DELETE FROM {schema}.{t}" for t in self._tables)
            restarts = ", ".join(
                f"setval('{schema}.{name}', {start}, false)" for name, start in self._sequences
            )
            # No foreign key or trigger fires (every table is emptied), and the data
            # need not survive a crash of the server.
            pg_execute(
                "BEGIN; SET LOCAL session_replication_role = replica;"
                f" SET LOCAL synchronous_commit = off; {deletes};"
                f" SELECT {restarts or 'NULL'}; COMMIT"
            )
            self._free.append(schema)
            return
        self._drop(schema)

    def _drop(self, schema: str) -> None:
        self._migrated.discard(schema)
        self._made.discard(schema)
        pg_execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    def _reusable(self, schema: str) -> bool:
        digest, stats = fingerprint(schema)
        if digest != self._reference or stats:
            return False
        rows = " + ".join(f"(SELECT count(*) FROM {schema}.{t})" for t in self._tables)
        vacuumed = (
            "SELECT count(*) FROM pg_class WHERE relkind = 'r' AND reltuples >= 0"
            f" AND relnamespace = '{schema}'::regnamespace"
        )
        found, touched, version = pg_fetchrow(
            f"SELECT {rows}, ({vacuumed}), ({_VERSION.format(schema=schema)})"
        )
        return bool(found <= self.REUSE_ROWS and touched == 0 and version == self._version)

    def drop_all(self) -> None:
        """Drop every schema this pool made: the free ones, and any a test still holds
        (one whose teardown never ran)."""
        for schema in sorted(self._made):
            self._drop(schema)
        self._free.clear()

"""Shared fixtures: a migrated database on every engine, each test isolated.

Storage tests take the ``db`` (or ``db_url``) fixture and so run once on SQLite and once
on PostgreSQL. PostgreSQL comes from ``$SYNCKIT_TEST_POSTGRES_URL`` (default: the server on
127.0.0.1:5432, database ``test``); every test gets a schema of its own, dropped afterwards.
Where PostgreSQL cannot be reached its cases are skipped with the reason, unless
``SYNCKIT_REQUIRE_SERVICES=1``, where they fail.
"""

from __future__ import annotations

import asyncio
import compileall
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import zygote  # tests/
from services import (
    PG_URL,
    SchemaPool,
    pg_execute,
    pg_fetchval,
    postgres_problem,
    service_unavailable,
    vacuum_catalogs,
)
from sqlalchemy.engine import make_url

from synckit.store import migrate
from synckit.store.db import Database, open_database

# Bytecode is cached even where $PYTHONDONTWRITEBYTECODE is set (this machine sets it):
# every xdist worker collects every test module, and pytest, which rewrites their asserts,
# then compiled them all again in each (~10 s of CPU a worker). From here on, the test
# modules' rewritten bytecode is written beside them, as pytest does by default.
sys.dont_write_bytecode = False

# Test apps (handler registries, connectors) are importable in-process too.
sys.path.insert(0, str(Path(__file__).parent / "apps"))

# Tenant configs' secrets and tokens are sealed with this key (commands run as
# subprocesses inherit it); tests of the keyless refusal remove it.
os.environ.setdefault("SYNCKIT_SECRET_KEY", "c3luY2tpdC10ZXN0cy1vbmx5LWtleS0zMi1ieXRlcyE=")


def pytest_configure(config: pytest.Config) -> None:
    """Compiled once: the CLI and worker processes the tests start import synckit from
    this checkout, and where ``$PYTHONDONTWRITEBYTECODE`` is set (this machine sets it)
    none of them could cache its bytecode, so every one compiled every module it imported
    again (~0.1 s of CPU per process, hundreds of processes). Bytecode is written, as
    Python does by default, beside the sources, in ``__pycache__`` (git ignores it); it is
    only read where the variable is set. Done by the controller, before the workers start.
    """
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).parent
    for tree in (root.parent / "synckit", root / "apps"):
        compileall.compile_dir(tree, quiet=1)
    _rewrite_test_modules(config, root)


def _rewrite_test_modules(config: pytest.Config, root: Path) -> None:
    """The test modules' assert-rewritten bytecode (and the helpers' plain bytecode),
    written once by the controller.

    Every xdist worker imports every test module to collect it, and pytest rewrites the
    asserts of each whose rewritten bytecode is not cached yet, then caches it. In a
    fresh checkout none is cached, and the workers, starting together, all rewrote all of
    them: ~19 s of CPU and ~9 s of wall on 2 cores before the first test. Written here
    (by pytest's own rewriting, as its import hook would), each worker only reads them.
    Skipped where asserts are not rewritten (``--assert=plain``).
    """
    from _pytest.assertion import rewrite

    state = config.stash.get(rewrite.assertstate_key, None)
    if state is None or state.mode != "rewrite":
        return
    for path in sorted(root.rglob("*.py")):
        if not path.name.startswith("test_") and path.name != "conftest.py":
            compileall.compile_file(path, quiet=1)  # a helper module: plain bytecode
            continue
        pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(path, pyc) is not None:
            continue
        if not rewrite.try_makedirs(pyc.parent):
            return
        source_hash, code = rewrite._rewrite_test(path, config)
        rewrite._write_pyc(state, code, source_hash, pyc)


#: Test modules whose tests take seconds of wall time (real worker processes, a real
#: broker, a wheel built and installed, whole runs against a paced API), with the seconds
#: one of their tests takes on a quiet 2-core machine (measured; only the balance of the
#: deal below reads them). The first suffix a module's path ends with counts.
LONG_FIRST: dict[str, float] = {
    "test_undeclared_limits_procs.py": 38,
    "test_wheel.py": 23,
    "test_newest_first_procs.py": 9,
    "test_oauth_lifecycle.py": 8,
    "test_breakers.py": 8,
    "test_flow_control_procs.py": 7,
    "test_records_procs.py": 7,
    "test_newcomer.py": 5,
    "test_intents_lost_responses.py": 5,
    "test_web_browser.py": 5,
    "test_demo.py": 4.5,
    "test_cli_sync_stream_and_holds.py": 4,
    "test_outbox_rabbit.py": 4,
    "test_webhooks_kill_procs.py": 4,
    "test_web_truth.py": 3,
    "test_queue_procs.py": 3,
    "test_lane_marks.py": 2.5,
    "test_oauth_race.py": 2,
    "_procs.py": 2,
    "test_start_marks.py": 1,
}


def _long_weight(nodeid: str) -> float | None:
    path = nodeid.split("::", 1)[0]
    return next((w for suffix, w in LONG_FIRST.items() if path.endswith(suffix)), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests (:data:`LONG_FIRST`) early in every xdist worker's share, a whole
    module to one worker.

    xdist's worksteal hands each worker one contiguous block of the collection at the
    start and later moves tests from the end of the longest queue to an idle worker. With
    every long test at the head of the collection, they all fell in the first worker's
    block and ran one after another, the last of them minutes after the other workers
    had run out of short tests. Here the long modules are dealt, longest first, each to
    the block with the least long work so far (the blocks xdist will cut: its own
    arithmetic, what is left divided by the workers left), and spread among that block's
    short tests (:func:`_spread`). A module goes whole to one block: dealt test by test,
    a module's tests sat at the same place in every block and ran at the same time, so
    the four tests that wait on a paced API for 40 s each left both cores idle together,
    and the tests that share one demo run waited on each other. Every worker orders the
    same way, so they agree on the order.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    modules: dict[str, list[pytest.Item]] = {}
    short: list[pytest.Item] = []
    for item in items:
        if _long_weight(item.nodeid) is None:
            short.append(item)
        else:
            modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    heads: list[list[list[pytest.Item]]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for tests in sorted(modules.values(), key=lambda t: -len(t) * (_long_weight(t[0].nodeid) or 0)):
        i = load.index(min(load))
        heads[i].append(tests)
        load[i] += len(tests) * (_long_weight(tests[0].nodeid) or 0)
    ordered: list[pytest.Item] = []
    left = len(items)
    for i, head in enumerate(heads):
        size = left // (workers - i)
        left -= size
        take = max(0, size - sum(map(len, head)))
        block = short[:take]
        del short[:take]
        ordered += _spread(head, block, phase=i / workers)
    items[:] = ordered + short


#: The share of its short tests over which a block's long modules are spread.
SPREAD = 0.6


def _spread(
    long_modules: list[list[pytest.Item]], short: list[pytest.Item], phase: float
) -> list[pytest.Item]:
    """``short`` with the ``long_modules`` placed at even intervals over its first
    :data:`SPREAD`, shifted by ``phase`` (0 to 1) of an interval: each process runs its
    long modules (mostly waits on processes, servers and paced APIs) between short tests
    (mostly CPU), at other moments than the other processes run theirs, so the cores are
    not left idle while every process waits at once, nor overloaded after."""
    if not long_modules:
        return short
    span = len(short) * SPREAD
    at = [int(span * (j + phase) / len(long_modules)) for j in range(len(long_modules))]
    out: list[pytest.Item] = []
    start = 0
    for place, tests in zip(at, long_modules, strict=True):
        out += short[start:place] + tests
        start = place
    return out + short[start:]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the tests are collected, each test process's collector is tuned as a
    ``synckit worker``'s is (:func:`synckit.cli.worker.tune_gc`): what collection made
    (the imported modules, the test items) is frozen, so no collection walks it again,
    and the youngest generation is collected every 10,000 allocations, not 700. At
    Python's defaults the collector was 13-20% of a test process's CPU, most of it full
    collections walking the modules and items; tuned, ~6%."""
    from synckit.cli.worker import tune_gc

    tune_gc()


#: Where the Python commands tests start are forked from a pre-imported process
#: (tests/zygote.py): not in unit tests, some of which read what a cold interpreter
#: imports. ``SYNCKIT_TEST_COLD_START=1`` turns it off for a whole run.
FORKED_DIRS = ("tests/integration/", "tests/e2e/")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if os.environ.get("SYNCKIT_TEST_COLD_START") != "1" and item.nodeid.startswith(FORKED_DIRS):
        zygote.install()
    else:
        zygote.uninstall()
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    zygote.stop()
    _pool.drop_all()
    # Once per run, by the process that started it (xdist's workers have ended by then):
    # the catalogs the run's schemas churned, vacuumed (services.vacuum_catalogs).
    if not hasattr(session.config, "workerinput") and postgres_problem() is None:
        problem = vacuum_catalogs()
        if problem is not None:
            print(f"\nthe PostgreSQL catalogs were not vacuumed: {problem}")


ENGINES = ["sqlite", "postgresql"]


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "postgresql" and (problem := postgres_problem()):
        service_unavailable("PostgreSQL", problem)
    return name


_pool = SchemaPool()


@pytest.fixture
def db_url(engine_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database of the parametrized engine, as a URL (usable by subprocesses).

    On PostgreSQL, a schema of its own. A test that also takes ``migrated_url`` (``db``)
    gets one from this process's pool of migrated schemas (:class:`services.SchemaPool`),
    emptied after the test; any other test, a new empty schema, dropped after it."""
    if engine_name == "sqlite":
        yield f"sqlite:///{tmp_path / 'synckit.db'}"
        return
    sep = "&" if "?" in PG_URL else "?"
    if "migrated_url" in request.fixturenames and request.getfixturevalue("_pg_template"):
        schema = _pool.take()
        try:
            yield f"{PG_URL}{sep}search_path={schema}"
        finally:
            _pool.give_back(schema)
        return
    schema = f"t_{uuid.uuid4().hex[:16]}"
    pg_execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{PG_URL}{sep}search_path={schema}"
    finally:
        pg_execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def _upgrade(url: str) -> None:
    d = open_database(url)
    try:
        await migrate.upgrade(d)
    finally:
        await d.dispose()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per test process (by the migrations, as
    ``synckit db upgrade`` does); each test gets a copy."""
    path = tmp_path_factory.mktemp("template") / "synckit.db"
    asyncio.run(_upgrade(f"sqlite:///{path}"))
    assert not path.with_name("synckit.db-wal").exists()  # closed cleanly: one file
    return path


_SCHEMA = "__synckit_test_schema__"


@pytest.fixture(scope="session")
def _pg_template() -> Iterator[str | None]:
    """The DDL of a PostgreSQL schema migrated to head once per test process (by the
    migrations), as ``pg_dump --schema-only`` prints it, with the schema's name as a
    placeholder and its alembic version row: replayed into each test's own schema in
    one round trip (~60 ms, where running the migrations costs ~150 ms). None without
    ``pg_dump``: each test then runs the migrations."""
    if shutil.which("pg_dump") is None:
        yield None
        return
    template = f"tpl_{uuid.uuid4().hex[:16]}"
    pg_execute(f"CREATE SCHEMA {template}")
    try:
        url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}search_path={template}"
        asyncio.run(_upgrade(url))
        pg = make_url(PG_URL)
        dump = subprocess.run(
            ["pg_dump", "--schema-only", "--no-owner", "--no-privileges",
             f"--schema={template}", "-h", pg.host or "127.0.0.1", "-p", str(pg.port or 5432),
             "-U", pg.username or "postgres", "-d", pg.database or "test"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        version = pg_fetchval(f"SELECT version_num FROM {template}.alembic_version")
        lines = [
            line
            for line in dump.replace(template, _SCHEMA).splitlines()
            # psql meta-commands (\restrict) and the schema, which the test made already
            if not line.startswith("\\") and not line.startswith(f"CREATE SCHEMA {_SCHEMA}")
        ]
        lines.append(f"INSERT INTO {_SCHEMA}.alembic_version VALUES ('{version}');")
        yield "\n".join(lines)
    finally:
        pg_execute(f"DROP SCHEMA IF EXISTS {template} CASCADE")


@pytest.fixture
def migrated_url(db_url: str, engine_name: str, request: pytest.FixtureRequest) -> str:
    """A database URL whose schema is at head: a copy of a schema the migrations built
    once for this test process (see the template fixtures; on PostgreSQL, a pooled schema
    already is one), or, without ``pg_dump``, the migrations run for this test."""
    if engine_name == "sqlite":
        template: Path = request.getfixturevalue("_sqlite_template")
        shutil.copyfile(template, make_url(db_url).database or "")
        return db_url
    schema = db_url.rsplit("search_path=", 1)[1]
    if _pool.migrated(schema):
        return db_url
    script: str | None = request.getfixturevalue("_pg_template")
    if script is None:
        asyncio.run(_upgrade(db_url))
        return db_url
    pg_execute(script.replace(_SCHEMA, schema))  # the simple query protocol: many at once
    _pool.filled(schema)
    return db_url


@pytest.fixture
async def db(migrated_url: str) -> AsyncIterator[Database]:
    """A migrated database on each engine, isolated to this test."""
    d = open_database(migrated_url)
    try:
        yield d
    finally:
        await d.dispose()

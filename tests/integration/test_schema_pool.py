"""The PostgreSQL schemas the tests reuse (``services.SchemaPool``): a schema is handed to
the next test only as the template made it (empty, sequences restarted, the same structure,
no statistics); one a test changed is dropped, not reused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from services import SchemaPool, pg_execute, pg_fetchval, postgres_problem, service_unavailable


@pytest.fixture
def pool(_pg_template: str | None) -> Iterator[tuple[SchemaPool, str]]:
    if problem := postgres_problem():
        service_unavailable("PostgreSQL", problem)
    if _pg_template is None:
        pytest.skip("pg_dump is not installed: every test's schema runs the migrations")
    pool = SchemaPool()
    try:
        yield pool, _pg_template
    finally:
        pool.drop_all()


def _migrated(pool: SchemaPool, template: str) -> str:
    schema = pool.take()
    pg_execute(template.replace("__synckit_test_schema__", schema))
    pool.filled(schema)
    return schema


def _exists(schema: str) -> bool:
    return bool(pg_fetchval(f"SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'"))


def test_a_schema_given_back_is_emptied_with_its_sequences_restarted_and_reused(
    pool: tuple[SchemaPool, str],
) -> None:
    p, template = pool
    schema = _migrated(p, template)
    pg_execute(
        f"INSERT INTO {schema}.jobs (kind, payload, status, run_at, created_at, updated_at)"
        " SELECT 'k', '{}', 'pending', now(), now(), now() FROM generate_series(1, 5)"
    )
    p.give_back(schema)
    again = p.take()
    assert again == schema and p.migrated(again)
    assert pg_fetchval(f"SELECT count(*) FROM {schema}.jobs") == 0
    assert pg_fetchval(f"SELECT count(*) FROM {schema}.alembic_version") == 1
    pg_execute(
        f"INSERT INTO {schema}.jobs (kind, payload, status, run_at, created_at, updated_at)"
        " VALUES ('k', '{}', 'pending', now(), now(), now())"
    )
    assert pg_fetchval(f"SELECT id FROM {schema}.jobs") == 1
    p.drop_all()  # a schema still held by a test is dropped too
    assert not _exists(schema)


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE {s}.jobs ADD COLUMN extra int",
        "CREATE INDEX extra_ix ON {s}.jobs (kind)",
        "CREATE TABLE {s}.extra (k int PRIMARY KEY)",
        "CREATE FUNCTION {s}.extra() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "ALTER TABLE {s}.jobs ALTER COLUMN kind SET DEFAULT 'x'",
        "UPDATE {s}.alembic_version SET version_num = 'older'",
        "ANALYZE {s}.jobs",
        "VACUUM {s}.jobs",
        "INSERT INTO {s}.jobs (kind, payload, status, run_at, created_at, updated_at)"
        " SELECT 'k', '{{}}', 'pending', now(), now(), now() FROM generate_series(1, 2001)",
    ],
    ids=["column", "index", "table", "function", "default", "version", "analyze", "vacuum",
         "rows"],
)  # fmt: skip
def test_a_schema_a_test_changed_is_dropped_not_reused(
    pool: tuple[SchemaPool, str], change: str
) -> None:
    p, template = pool
    schema = _migrated(p, template)
    pg_execute(change.format(s=schema))
    p.give_back(schema)
    assert not _exists(schema)
    assert p.take() != schema
    p.drop_all()
    assert not _exists(schema)


def test_a_schema_whose_test_failed_before_its_migration_is_dropped(
    pool: tuple[SchemaPool, str],
) -> None:
    p, _ = pool
    schema = p.take()
    p.give_back(schema)
    assert not _exists(schema)

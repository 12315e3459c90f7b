"""The test servers: where PostgreSQL is, whether it can be reached, and whether the
servers (PostgreSQL, RabbitMQ) are required: a test that cannot reach one is skipped with
the reason, or fails under ``SYNCKIT_REQUIRE_SERVICES=1`` (CI).

A module of its own, not ``conftest``: ``tests/e2e/conftest.py`` is also a module named
``conftest``, so ``from conftest import ...`` found whichever was imported first.
"""

from __future__ import annotations

import os
import socket

import pytest
from sqlalchemy.engine import make_url

from synckit.store.db import open_database

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


async def _pg_admin(sql: str) -> None:
    admin = open_database(PG_URL, pool_size=1)
    try:
        async with admin.engine.connect() as conn:
            await conn.exec_driver_sql(sql)
            await conn.commit()
    finally:
        await admin.dispose()

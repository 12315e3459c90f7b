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


def pg_execute(sql: str) -> None:
    """Run ``sql`` (one or many statements; no parameters) on PostgreSQL, committed."""
    _admin.run(lambda conn: conn.execute(sql))


def pg_fetchval(sql: str) -> Any:
    """The first value of ``sql``'s first row, on PostgreSQL."""
    return _admin.run(lambda conn: conn.fetchval(sql))

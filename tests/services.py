"""Whether the test servers (PostgreSQL, RabbitMQ) are required: a test that cannot reach
one is skipped with the reason, or fails under ``SYNCKIT_REQUIRE_SERVICES=1`` (CI).

A module of its own, not ``conftest``: ``tests/e2e/conftest.py`` is also a module named
``conftest``, so ``from conftest import ...`` found whichever was imported first.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_SERVICES = os.environ.get("SYNCKIT_REQUIRE_SERVICES") == "1"


def service_unavailable(name: str, reason: str) -> None:
    """Skip the test, or fail it when the services are required (CI)."""
    message = f"{name} unavailable: {reason}"
    if REQUIRE_SERVICES:
        pytest.fail(message + " (SYNCKIT_REQUIRE_SERVICES=1)")
    pytest.skip(message)

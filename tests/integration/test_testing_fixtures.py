"""synckit.testing.fixtures: the pytest plugin connector authors enable, and its helpers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from waits import PROCESS_TIMEOUT  # tests/

from synckit.errors import is_testing
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.store.jobs.enqueueing import enqueue
from synckit.testing.fixtures import (
    instant_retries_enabled,
    migrated_sqlite,
    run_worker_until_idle,
)

CONNECTOR_AUTHORS_TESTS = """
from datetime import timedelta

import httpx
import pytest

from synckit.errors import is_testing
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.store.jobs.enqueueing import enqueue
from synckit.testing import FakeAPI, FakeClock, Fault


def flaky_registry(failures: int) -> tuple[Registry, list[int]]:
    registry = Registry()
    attempts: list[int] = []

    @registry.handler("sync", max_attempts=5)
    async def sync(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) <= failures:
            raise ConnectionError("the API hung up")

    return registry, attempts


@pytest.mark.asyncio
async def test_run_until_idle_retries_instantly(synckit_db, run_until_idle):
    registry, attempts = flaky_registry(failures=2)
    await enqueue(synckit_db, "sync", {"tenant": "t1"})
    stats = await run_until_idle(registry)
    assert attempts == [1, 2, 3]
    assert (stats.succeeded, stats.retried) == (1, 2)


@pytest.mark.asyncio
async def test_run_until_idle_takes_an_object_with_a_registry(synckit_db, run_until_idle):
    class App:
        def __init__(self, registry):
            self.registry = registry

    registry, attempts = flaky_registry(failures=0)
    await enqueue(synckit_db, "sync")
    stats = await run_until_idle(App(registry))
    assert stats.succeeded == 1 and attempts == [1]


@pytest.mark.asyncio
async def test_run_until_idle_refuses_anything_else(run_until_idle):
    with pytest.raises(TypeError, match="Registry"):
        await run_until_idle(object())


def test_instant_retries_is_on_inside_the_test(instant_retries):
    assert is_testing()


def test_and_off_again_afterwards():
    assert not is_testing()


def test_synckit_clock_is_a_fake_clock(synckit_clock):
    assert isinstance(synckit_clock, FakeClock)
    before = synckit_clock()
    synckit_clock.advance(timedelta(minutes=1))
    assert synckit_clock() - before == timedelta(minutes=1)


@pytest.mark.asyncio
async def test_fake_api_is_fresh(fake_api):
    assert isinstance(fake_api, FakeAPI) and fake_api.requests == []
    fake_api.route("GET", "/ping", {"ok": True})
    fake_api.script("GET", "/ping", [Fault.unavailable()])
    async with httpx.AsyncClient(transport=fake_api.transport(), base_url="https://x") as c:
        assert (await c.get("/ping")).status_code == 503
        assert (await c.get("/ping")).json() == {"ok": True}
"""


def test_a_connector_author_s_suite_uses_the_plugin_in_strict_asyncio_mode(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["synckit.testing.fixtures"]\n')
    (tmp_path / "test_connector.py").write_text(textwrap.dedent(CONNECTOR_AUTHORS_TESTS))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=strict",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 passed" in result.stdout


def test_the_only_entry_point_is_the_small_plugin() -> None:
    """Installing synckit registers one pytest11 plugin, synckit.testing.plugin (asyncio
    mode and these fixtures; ``-p no:synckit`` turns it off), nothing else."""
    from importlib.metadata import entry_points

    ours = [ep.value for ep in entry_points(group="pytest11") if ep.value.startswith("synckit")]
    assert ours == ["synckit.testing.plugin"]


async def test_the_helpers_behind_the_fixtures_work_without_pytest(tmp_path: Path) -> None:
    registry = Registry()
    attempts: list[int] = []

    @registry.handler("sync")
    async def sync(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise ConnectionError("always down")

    async with migrated_sqlite(tmp_path / "x.db") as db:
        await enqueue(db, "sync", max_attempts=3)
        stats = await run_worker_until_idle(registry, db)
    assert attempts == [1, 2, 3]
    assert (stats.retried, stats.dead) == (2, 1)
    assert not is_testing()


def test_instant_retries_restore_the_previous_setting() -> None:
    with instant_retries_enabled():
        assert is_testing()
        with instant_retries_enabled():
            assert is_testing()
        assert is_testing()
    assert not is_testing()

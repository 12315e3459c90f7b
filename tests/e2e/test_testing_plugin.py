"""The pytest plugin (entry point pytest11) runs a connector author's async tests and gives
them synckit's fixtures with no configuration; a project's own asyncio_mode stands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from waits import PROCESS_TIMEOUT  # tests/

AUTHOR_TEST = """
from synckit.store.db import Database
from synckit.testing import FakeClock


async def test_an_async_test_gets_a_migrated_database(synckit_db: Database) -> None:
    async with synckit_db.begin() as conn:
        assert (await conn.exec_driver_sql("SELECT count(*) FROM jobs")).scalar() == 0


def test_the_fake_clock_fixture(synckit_clock: FakeClock) -> None:
    assert synckit_clock() is not None
"""


def pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SYNCKIT_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )  # fmt: skip


def test_async_tests_and_fixtures_work_with_no_configuration(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the author's: nothing about asyncio
    (tmp_path / "test_connector.py").write_text(AUTHOR_TEST)
    result = pytest_in(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "2 passed" in result.stdout

    without = pytest_in(tmp_path, "-p", "no:synckit")
    assert without.returncode != 0
    assert "fixture 'synckit_db' not found" in without.stdout


def test_a_project_that_chose_strict_mode_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\n")
    (tmp_path / "test_connector.py").write_text(AUTHOR_TEST)
    result = pytest_in(tmp_path)
    # Strict mode: an unmarked async test is not run by pytest-asyncio.
    assert "1 passed" in result.stdout, result.stdout[-3000:]


VCR_TEST = """
import httpx
import pytest

from synckit.testing import FakeAPI


@pytest.mark.vcr
async def test_a_recorded_call() -> None:
    api = FakeAPI()
    api.route("GET", "/me", {"name": "acme", "access_token": "srv-issued-9z8y7x"})
    with api.serve_in_thread() as url:
        async with httpx.AsyncClient() as c:
            me = await c.get(url + "/me", params={"api_key": "k-5551234"},
                             headers={"Authorization": "Bearer author-secret-42"})
    assert me.json()["name"] == "acme"
"""


def test_pytest_recording_cassettes_are_scrubbed_by_default(tmp_path: Path) -> None:
    (tmp_path / "test_vcr.py").write_text(VCR_TEST)
    result = pytest_in(tmp_path, "--record-mode=once")
    assert result.returncode == 0, result.stdout[-3000:]
    (cassette,) = (tmp_path / "cassettes" / "test_vcr").glob("*.yaml")
    stored = cassette.read_text()
    assert "name" in stored and "acme" in stored
    for secret in ("srv-issued-9z8y7x", "k-5551234", "author-secret-42"):
        assert secret not in stored


DOCS = Path(__file__).resolve().parents[2] / "docs" / "connectors.md"


def doc_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)


def test_the_docs_testing_example_runs_as_printed(tmp_path: Path) -> None:
    """docs/connectors.md's connector (helpdesk_sync.py) and its testing example, word for
    word, run by pytest in an empty project with no SYNCKIT_SECRET_KEY: the plugin gives
    the test session a key, so the tenant's secret config is sealed as in production."""
    blocks = doc_blocks()
    connector = next(b for b in blocks if b.startswith("# helpdesk_sync.py"))
    (example,) = [b for b in blocks if "async def test_a_429_is_waited_out" in b]
    (tmp_path / "helpdesk_sync.py").write_text(connector)
    (tmp_path / "test_helpdesk.py").write_text(example)
    result = pytest_in(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout

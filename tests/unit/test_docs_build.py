"""The documentation site builds with `mkdocs build --strict`: every page in the nav
exists, no link inside docs/ is broken, and the API reference is generated from the
docstrings of the code as it is (a renamed or removed module fails the build)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from waits import PROCESS_TIMEOUT  # tests/

ROOT = Path(__file__).resolve().parents[2]


def _importable(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


pytestmark = pytest.mark.skipif(
    not _importable("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"),
    reason="mkdocs and mkdocstrings[python] are not installed (pip install -e '.[dev]')",
)


def test_the_site_and_its_api_reference_build_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=2 * PROCESS_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    for page, names in {
        "reference/connectors": ["Connector", "SyncContext", "CursorPaginator", "Incremental"],
        "reference/testing": ["FakeAPI", "FakeClock", "use_cassette", "run_until_idle"],
        "reference/errors": ["RateLimited", "classify", "BreakerPolicy", "PacePolicy"],
        "reference/runtime": ["Registry", "Worker", "enqueue", "Waiter"],
        "runtime": ["max_inline_wait", "Retry-After", "needs_reauth", "cool-down"],
    }.items():
        html = (site / page / "index.html").read_text()
        missing = [n for n in names if n not in html]
        assert not missing, f"{page}: {missing}"

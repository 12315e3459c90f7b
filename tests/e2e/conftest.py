"""The browser tests' Playwright and Chromium (see tests/console_browser.py): skipped
without Debian's chromium, failed instead under SYNCKIT_REQUIRE_SERVICES=1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def pw() -> Iterator[Any]:
    from console_browser import CHROMIUM  # tests/

    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        why = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("SYNCKIT_REQUIRE_SERVICES") == "1":
            pytest.fail(why + " (SYNCKIT_REQUIRE_SERVICES=1; .ci/run installs it)")
        pytest.skip(why)
    with playwright_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(pw: Any) -> Iterator[Any]:
    from console_browser import CHROMIUM  # tests/

    b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    try:
        yield b
    finally:
        b.close()

"""The console under a real Chromium (Debian's, by its path; nothing downloaded): shared
by the browser tests (tests/e2e/test_web_*.py), whose ``pw`` and ``browser`` fixtures are
in tests/e2e/conftest.py.

:func:`console` starts ``synckit web --app web_app:app`` on a database and yields its
base URL; :func:`seeded_db` makes a migrated SQLite database seeded by
``tests/apps/web_app.seed`` (the storage paths run on both engines in tests/integration).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT, wait_until

from synckit.store import migrate
from synckit.store.db import open_database

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "tests" / "apps"
CHROMIUM = os.environ.get("SYNCKIT_CHROMIUM", "/usr/bin/chromium")
SYNCKIT = [sys.executable, "-m", "synckit.cli"]
if str(APPS) not in sys.path:
    sys.path.insert(0, str(APPS))


def env(**changes: str | None) -> dict[str, str]:
    """The environment of a spawned command, tests/apps importable; None removes a name."""
    out = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
    }
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run(coro: Any) -> Any:
    """Run a coroutine to its end: Playwright's sync API runs an event loop in this
    thread, so another thread's."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def with_db(url: str, fn: Any) -> Any:
    """``await fn(db)`` on a Database opened (and disposed of) for it."""

    async def go() -> Any:
        db = open_database(url)
        try:
            return await fn(db)
        finally:
            await db.dispose()

    return run(go())


def seeded_db(tmp: Path, *, before: Any = None) -> tuple[str, dict[str, Any]]:
    """A migrated SQLite database in ``tmp``, ``await before(db)`` (its result merged
    into what is returned) then seeded; its URL and what the seed made."""
    from web_app import seed

    url = f"sqlite:///{tmp / 'synckit.db'}"

    async def prepare(db: Any) -> Any:
        await migrate.upgrade(db)
        extra = await before(db) if before is not None else {}
        return {**await seed(db), **extra}

    return url, with_db(url, prepare)


@contextmanager
def console(
    url: str, tmp: Path, *args: str, app: str = "web_app:app", **env_changes: str | None
) -> Iterator[str]:
    """``synckit web --app APP`` on ``url``; yields its base URL."""
    port = free_port()
    log = tmp / f"web-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                *SYNCKIT,
                "web",
                "--app",
                app,
                "--database-url",
                url,
                "--port",
                str(port),
                "--refresh",
                "0.5",
                *args,
            ],
            env=env(**env_changes),
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"synckit web exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return True
        except OSError:
            return False

    try:
        wait_until(listening, lambda: f"synckit web did not listen: {log.read_text()[-2000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(PROCESS_TIMEOUT)


@contextmanager
def page_on(browser: Any, base: str) -> Iterator[Any]:
    """A fresh browser context (its own cookies) on ``base``, and its page."""
    context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(EVENT_TIMEOUT * 1000)  # waits for a selector are for events
    try:
        yield page
    finally:
        context.close()

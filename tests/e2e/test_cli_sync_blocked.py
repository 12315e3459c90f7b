"""`synckit sync T --wait` stops as soon as the cycle cannot go on (the tenant needs
re-authorisation, or was paused), with the reason and exit code 1, instead of waiting out
its timeout; run as subprocesses on both engines (exit codes and timing are the point)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import LoopbackServer, Request  # tests/

from synckit.runtime.admin.tenants import pause_tenant
from synckit.store.db import open_database
from synckit.store.jobs.admin import list_jobs

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APP = """
import os
from synckit import App, Connector, Page


class Locked(Connector):
    name = "locked"
    base_url = os.environ["LOCKED_API_URL"]

    async def poll(self, ctx, checkpoint):
        body = (await ctx.http.get("/items")).json()
        yield Page(body["items"], checkpoint={"read": True})

    async def handle(self, ctx, record):
        pass


app = App([Locked])
"""
#: Far longer than the test may take: --wait must not wait it out.
TIMEOUT = "600"
#: How long the test lets `sync --wait` take to notice (a generous budget, not a bound).
BUDGET = 120


@pytest.fixture
def api() -> Iterator[LoopbackServer]:
    def respond(req: Request) -> tuple[int, dict[str, str], bytes]:
        return 401, {"Content-Type": "application/json"}, b'{"error": "invalid_token"}'

    server = LoopbackServer(respond)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def workdir(tmp_path: Path, migrated_url: str, api: LoopbackServer) -> Path:
    (tmp_path / "locked_app.py").write_text(APP)
    added = subprocess.run(
        [*SYNCKIT, "tenants", "add", "acme", "locked", "--app", "locked_app:app"],
        cwd=tmp_path, env=environment(migrated_url, api), capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    return tmp_path


def environment(url: str, api: LoopbackServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    return {
        **env,
        "SYNCKIT_SECRET_KEY": os.environ["SYNCKIT_SECRET_KEY"],
        "SYNCKIT_DATABASE_URL": url,
        "LOCKED_API_URL": api.url,
    }


def start(cwd: Path, url: str, api: LoopbackServer, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SYNCKIT, *args, "--app", "locked_app:app"], cwd=cwd, env=environment(url, api),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_wait_ends_with_the_reason_when_the_tenant_needs_reauth(
    workdir: Path, migrated_url: str, api: LoopbackServer
) -> None:
    """The API refuses the credentials: the worker marks the tenant needs_reauth and `sync
    --wait` says so at once, exit 1, naming the command that fixes it."""
    sync = start(workdir, migrated_url, api, "sync", "acme", "--wait", "--timeout", TIMEOUT)
    worker = start(workdir, migrated_url, api, "worker")
    try:
        _, err = sync.communicate(timeout=BUDGET)
    finally:
        worker.terminate()
        worker.communicate(timeout=60)
    assert sync.returncode == 1, err
    assert "needs re-authorisation" in err and "synckit tenants reauth acme" in err, err
    assert "has not ended" not in err and "not claimed yet" not in err
    assert api.requests  # the worker did ask the API


def test_wait_ends_with_the_reason_when_the_tenant_is_paused(
    workdir: Path, migrated_url: str, api: LoopbackServer
) -> None:
    """No worker runs; the tenant is paused while `sync --wait` follows its queued cycle:
    it stops, exit 1, saying the cycle stays queued and how to resume."""
    sync = start(workdir, migrated_url, api, "sync", "acme", "--wait", "--timeout", TIMEOUT)

    async def pause_once_enqueued() -> None:
        db = open_database(migrated_url)
        try:
            # The job is written by another process: polled for (no event reaches here).
            for _ in range(BUDGET * 20):
                if await list_jobs(db):
                    break
                await asyncio.sleep(0.05)
            await pause_tenant(db, "acme", reason="billing hold")
        finally:
            await db.dispose()

    asyncio.run(asyncio.wait_for(pause_once_enqueued(), BUDGET))
    _, err = sync.communicate(timeout=BUDGET)
    assert sync.returncode == 1, err
    assert "is paused (billing hold)" in err and "synckit tenants resume acme" in err, err
    assert "the cycle stays queued" in err
    assert not api.requests

"""`synckit worker --metrics-port`: where /metrics listens, and that it names no secret
(issue 16: "/metrics bound 0.0.0.0 with no option"; the hostile-input suite's /metrics).

The worker runs as a subprocess; the address it listens on is read from the process itself
(psutil), and the port found there is scraped.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from engines import sqlite_only  # tests/
from loopback import LoopbackServer, Request
from sqlalchemy import func, select
from waits import PROCESS_TIMEOUT, stop, wait_until  # tests/

from synckit.store.db import open_database
from synckit.store.tables import dead_letters

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parent.parent / "apps"
APP = "connector_app:app"


def env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


def start_worker(url: str, log: Path, *args: str, **extra_env: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [*SYNCKIT, "worker", "--app", APP, "--database-url", url, "--poll-interval", "0.2",
             "--metrics-port", "0", *args],
            env=env(**extra_env), stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip


def listening(proc: subprocess.Popen[bytes], log: Path) -> tuple[str, int]:
    """The one (address, port) the worker listens on, once it listens."""

    def found() -> list[Any]:
        assert proc.poll() is None, log.read_text()[-3000:]
        return [
            c.laddr
            for c in psutil.Process(proc.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]

    addresses = wait_until(found, lambda: log.read_text()[-3000:])
    assert len(addresses) == 1, addresses
    return addresses[0].ip, addresses[0].port


@sqlite_only
def test_metrics_listen_on_loopback_by_default(migrated_url: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(migrated_url, log)
    try:
        host, port = listening(proc, log)
        assert host == "127.0.0.1", (host, port)
        reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert reply.status_code == 200 and "synckit_database_up 1.0" in reply.text
    finally:
        stop(proc)


@sqlite_only
def test_metrics_listen_on_the_host_given(migrated_url: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(migrated_url, log, "--metrics-host", "127.0.0.2")
    try:
        host, port = listening(proc, log)
        # Only where it was told: its one listening socket (listening() holds it to one)
        # is on 127.0.0.2. A connection to 127.0.0.1 on the same port number would say
        # nothing: another test's server may hold that number on that address.
        assert host == "127.0.0.2", (host, port)
        reply = httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=10)
        assert reply.status_code == 200 and "synckit_database_up 1.0" in reply.text
    finally:
        stop(proc)
    # The environment variable the option names does the same.
    proc = start_worker(migrated_url, log, SYNCKIT_METRICS_HOST="127.0.0.3")
    try:
        assert listening(proc, log)[0] == "127.0.0.3"
    finally:
        stop(proc)


@pytest.fixture
def echoing_api() -> Iterator[LoopbackServer]:
    """An API that quotes the caller's credentials back in every error it gives."""

    polls: list[Request] = []

    def respond(req: Request) -> tuple[int, dict[str, str], bytes]:
        token = req.headers.get("Authorization", "").removeprefix("Bearer ")
        echo = f"rejected: Authorization: Bearer {token}; api_token={token}; token {token}"
        if req.path.startswith("/items"):
            polls.append(req)
            if len(polls) == 1:  # the first cycle fails (and is retried), quoting it
                return 500, {"Content-Type": "text/plain"}, echo.encode()
            body = b'{"items": [{"id": "r1"}, {"id": "r2"}], "next": null}'
            return 200, {"Content-Type": "application/json"}, body
        return 400, {"Content-Type": "text/plain"}, echo.encode()  # each record: dead letter

    server = LoopbackServer(respond)
    try:
        yield server
    finally:
        server.close()


def _dead_letters(url: str) -> int:
    async def go() -> int:
        db = open_database(url)
        try:
            async with db.begin() as conn:
                return int((await conn.execute(select(func.count(dead_letters.c.id)))).scalar())
        finally:
            await db.dispose()

    return asyncio.run(go())


def test_metrics_after_a_run_whose_api_echoes_the_secret_hold_no_secret(
    migrated_url: str, tmp_path: Path, echoing_api: LoopbackServer
) -> None:
    secret = f"tok-{uuid.uuid4().hex}"
    add = subprocess.run(
        [*SYNCKIT, "tenants", "add", "acme", "demo", "--set", f"api_token={secret}",
         "--app", APP, "--database-url", migrated_url],
        env=env(), capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    log = tmp_path / "worker.log"
    proc = start_worker(migrated_url, log, CONNECTOR_APP_URL=echoing_api.url)
    try:
        _, port = listening(proc, log)
        wait_until(lambda: _dead_letters(migrated_url) >= 2, lambda: log.read_text()[-3000:])
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        stop(proc)
    # The API did echo it: the secret was there to leak.
    assert any(r.path == "/sink" for r in echoing_api.requests)
    assert secret not in text
    assert secret[4:] not in text
    # The scrape is of this run: the API calls, and the tenant's dead letters.
    assert 'synckit_api_calls_total{connector="demo",status_class="4xx"}' in text
    assert 'synckit_api_calls_total{connector="demo",status_class="5xx"}' in text
    assert 'synckit_jobs_total{kind="synckit.poll",outcome="retried"}' in text, text
    assert 'synckit_dlq_size{connector="demo",status="review",tenant="acme"} 2.0' in text, text

"""One corrupt `connections` row costs only its tenant: `synckit worker` (a subprocess, on
both engines) holds the tenant whose config is not JSON, is a JSON array, or whose token
set is garbage bytes, and syncs the canary tenant beside them; `secrets check` says
"corrupt", not "put the missing key"."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from inprocess import run_cli  # tests/
from sqlalchemy import select, text, update

from synckit.store.checkpoints import load_checkpoint
from synckit.store.connections import UNREADABLE_ROW_REASON
from synckit.store.db import Database, open_database
from synckit.store.tables import connections

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parent.parent / "apps"
APP = "connector_app:app"
KEY = Fernet.generate_key().decode()

#: Each kind of damage, and what the held tenant's reason must name. PostgreSQL's jsonb
#: holds only JSON: there "not JSON" is a JSON string of the same text.
CORRUPT = {
    "bad-text": "config",
    "bad-array": "config: the stored config is a JSON list",
    "bad-tokens": "tokens: the stored tokens are in an unknown format",
}
BAD_TEXT = {"sqlite": "'{not json'", "postgresql": "'\"{not json\"'::jsonb"}


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def _reply(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200 if self.command == "GET" else 201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        page = int(self.path.rpartition("page=")[2] or 0)
        items = [{"id": f"r{page}-{i}"} for i in range(2)] if page <= 2 else []
        self._reply({"items": items, "next": page + 1 if page < 2 else None})

    def do_POST(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        self.rfile.read(int(self.headers["Content-Length"]))
        self._reply({})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_url() -> Iterator[str]:
    _Api.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def synckit(
    *args: str, api: str = "http://127.0.0.1:9", process: bool = False
) -> subprocess.CompletedProcess[str]:
    """``synckit *args``: in this process (tests/inprocess.py), or with ``process=True`` in
    a process of its own (the workers: what the module is about)."""
    if not process:
        return run_cli(*args, env={"SYNCKIT_SECRET_KEY": KEY, "CONNECTOR_APP_URL": api})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "SYNCKIT_SECRET_KEY": KEY,
        "CONNECTOR_APP_URL": api,
        "COLUMNS": "300",
    }
    return subprocess.run([*SYNCKIT, *args], capture_output=True, text=True, env=env, timeout=180)


def with_db(url: str, make: Any) -> Any:
    async def go() -> Any:
        db = open_database(url)
        try:
            return await make(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


def corrupt(url: str, engine: str) -> None:
    async def go(db: Database) -> None:
        async with db.begin() as conn:
            await conn.execute(
                text(
                    f"UPDATE connections SET config = {BAD_TEXT[engine]} WHERE tenant = 'bad-text'"
                )
            )
            await conn.execute(
                text("UPDATE connections SET config = '[1, 2]' WHERE tenant = 'bad-array'")
            )
            await conn.execute(
                update(connections)
                .where(connections.c.tenant == "bad-tokens")
                .values(token_set=b"\x00\xffgarbage\x1b[2J not a token set")
            )

    with_db(url, go)


def statuses(url: str) -> dict[str, tuple[str, str | None]]:
    async def go(db: Database) -> dict[str, tuple[str, str | None]]:
        async with db.read() as conn:
            rows = await conn.execute(
                select(connections.c.tenant, connections.c.status, connections.c.status_reason)
            )
            return {r.tenant: (r.status, r.status_reason) for r in rows}

    result: dict[str, tuple[str, str | None]] = with_db(url, go)
    return result


def test_corrupt_connection_rows_hold_only_their_tenants(
    migrated_url: str, engine_name: str, api_url: str
) -> None:
    """Config not JSON, config a JSON array, garbage token-set bytes: each tenant is held
    (paused, its reason naming the fault, an alert) and the worker syncs the canary."""
    db = ("--database-url", migrated_url)
    for tenant in ("canary", *CORRUPT):
        added = synckit(
            "tenants", "add", tenant, "demo", "--set", f"api_token=tok-{tenant}",
            "--app", APP, *db,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        # A cycle queued for each: the held ones must not run theirs.
        queued = synckit("sync", tenant, "--app", APP, *db)
        assert queued.returncode == 0, queued.stderr
    corrupt(migrated_url, engine_name)

    check = synckit("secrets", "check", *db)
    assert check.returncode == 2, check.stdout + check.stderr
    line = check.stderr.strip().splitlines()[-1]
    assert "cannot open the secrets of 3 active tenants" in line, line
    for tenant in CORRUPT:
        assert f"tenant {tenant} (" in line and ") is corrupt:" in line, line
    assert "missing key" not in line and "no key is missing: the row is damaged" in line, line

    worker = synckit("worker", "--burst", "--app", APP, *db, api=api_url, process=True)
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert with_db(migrated_url, lambda d: load_checkpoint(d, "canary", "demo", "default")) == {
        "page": 2
    }, worker.stderr[-3000:]
    assert set(_Api.seen) == {"Bearer tok-canary"}, "a held tenant called the API"

    held = statuses(migrated_url)
    assert held["canary"] == ("active", None)
    for tenant, fault in CORRUPT.items():
        status, reason = held[tenant]
        assert status == "paused", (tenant, held[tenant])
        assert reason is not None and reason.startswith(f"{UNREADABLE_ROW_REASON} {fault}"), (
            tenant,
            reason,
        )
    assert "tenant.held_unreadable" in worker.stderr

    status = synckit("status", "--json", *db)
    assert status.returncode == 0, status.stderr
    firing = {
        a["subject"]
        for a in json.loads(status.stdout)["alerts_firing"]
        if a["rule"] == "unreadable_connection"
    }
    assert firing == set(CORRUPT)
    # Held, they no longer stop anything: the check passes, a second worker starts.
    assert synckit("secrets", "check", *db).returncode == 0
    again = synckit("worker", "--burst", "--app", APP, *db, api=api_url, process=True)
    assert again.returncode == 0, again.stderr[-3000:]

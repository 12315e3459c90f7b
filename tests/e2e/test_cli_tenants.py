"""`synckit tenants ...` (in process, tests/inprocess.py; one test as a process) and
`synckit worker --app <App>` (as a process), on both engines."""

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
from engines import sqlite_only  # tests/
from inprocess import run_cli  # tests/
from waits import PROCESS_TIMEOUT, stop, wait_until  # tests/

from synckit.store.checkpoints import load_checkpoint
from synckit.store.db import open_database

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parent.parent / "apps"
APP = "connector_app:app"


def env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "200",
        **extra,
    }


def synckit(
    *args: str, process: bool = False, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    if not process:
        return run_cli(*args, env=extra_env)
    return subprocess.run(
        [*SYNCKIT, *args],
        capture_output=True,
        text=True,
        env=env(**extra_env),
        timeout=PROCESS_TIMEOUT,
    )


def tenants(url: str, *args: str, process: bool = False) -> subprocess.CompletedProcess[str]:
    return synckit("tenants", *args, "--database-url", url, process=process)


def ls(url: str, *args: str) -> list[dict[str, Any]]:
    result = tenants(url, "ls", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@sqlite_only
def test_add_list_show_pause_resume_remove(migrated_url: str) -> None:
    """The tenant lifecycle from the shell: every command, its output and its effect."""
    add = tenants(
        migrated_url,
        "add", "acme", "demo", "--config", '{"api_token": "s3cret"}',
        "--set", "page_size=20", "--schedule", "every 10m", "--app", APP,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert "tenant acme added" in add.stdout and "demo:acme" in add.stdout
    [row] = ls(migrated_url)
    assert (row["tenant"], row["connector"], row["status"]) == ("acme", "demo", "active")
    assert row["schedule"] == "every 10m" and row["resource_key"] == "demo:acme"
    table = tenants(migrated_url, "ls")
    assert table.returncode == 0 and "acme" in table.stdout and "demo" in table.stdout

    show = tenants(migrated_url, "show", "acme", "--app", APP)
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    assert shown["config"] == {"api_token": "***", "page_size": 20}
    assert shown["checkpoints"] == {} and shown["dead_letters"] == {}
    assert "s3cret" not in show.stdout + tenants(migrated_url, "show", "acme").stdout

    pause = tenants(migrated_url, "pause", "acme", "--reason", "customer asked")
    assert pause.returncode == 0 and "paused (customer asked)" in pause.stdout
    assert [r["tenant"] for r in ls(migrated_url, "--status", "paused")] == ["acme"]
    assert ls(migrated_url, "--status", "active") == []
    resume = tenants(migrated_url, "resume", "acme")
    assert resume.returncode == 0 and "active" in resume.stdout

    remove = tenants(migrated_url, "remove", "acme", "--yes")
    assert remove.returncode == 0 and "tenant acme removed" in remove.stdout
    assert ls(migrated_url) == []
    gone = tenants(migrated_url, "show", "acme")
    assert gone.returncode == 2 and "no tenant 'acme'" in gone.stderr


@sqlite_only
def test_invalid_config_is_refused_naming_the_field(migrated_url: str) -> None:
    """A config the connector's model refuses: exit 2, one line naming the fields."""
    bad = tenants(migrated_url, "add", "bad", "demo", "--set", "page_size=lots", "--app", APP)
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid config for tenant 'bad'")
    assert "api_token: Field required" in lines[0] and "page_size:" in lines[0]
    assert "Traceback" not in bad.stderr
    assert ls(migrated_url) == []


@sqlite_only
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add", "t1", "nope", "--app", APP), "unknown connector 'nope' (this app knows: demo)"),
        (("add", "t1", "demo", "--config", "[1]", "--app", APP), "config must be a JSON object"),
        (("add", "t1", "demo", "--config", "{", "--app", APP), "config is not JSON"),
        (("add", "t1", "demo", "--set", "api_token=x", "--schedule", "often", "--app", APP),
         "schedule 'often'"),
        (("add", "a:b", "demo", "--set", "api_token=x", "--app", APP), "tenant name 'a:b'"),
        (("add", "t1", "demo"), "--app is required"),
        (("add", "t1", "demo", "--app", "connector_app:Demo"), "is not a synckit App"),
        (("pause", "ghost"), "no tenant 'ghost'"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_with_exit_code_2(
    migrated_url: str, args: tuple[str, ...], message: str
) -> None:
    result = tenants(migrated_url, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


@sqlite_only
def test_adding_a_tenant_twice_is_refused(migrated_url: str) -> None:
    """As processes: the console entry's acceptance for the tenants commands."""
    add = ("add", "acme", "demo", "--app", APP)
    first = tenants(migrated_url, *add, "--set", "api_token=x", process=True)
    assert first.returncode == 0, first.stderr
    again = tenants(migrated_url, *add, "--set", "api_token=y", process=True)
    assert again.returncode == 2 and "exists already" in again.stderr


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posted: list[str] = []
    #: When set, requests without ``Authorization: Bearer <it>`` are answered 401.
    required_token: str | None = None

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refused(self) -> bool:
        required = type(self).required_token
        if required is not None and self.headers.get("Authorization") != f"Bearer {required}":
            self._reply(401, {"error": "invalid api key"})
            return True
        return False

    def do_GET(self) -> None:
        if self._refused():
            return
        page = int(self.path.rpartition("page=")[2] or 0)
        items = [{"id": f"r{page}-{i}"} for i in range(2)] if page <= 2 else []
        self._reply(200, {"items": items, "next": page + 1 if page < 2 else None})

    def do_POST(self) -> None:
        if self._refused():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posted.append(body["id"])
        self._reply(201, {})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_url() -> Iterator[str]:
    _Api.posted = []
    _Api.required_token = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _checkpoint(url: str) -> Any:
    async def go() -> Any:
        db = open_database(url)
        try:
            return await load_checkpoint(db, "acme", "demo", "default")
        finally:
            await db.dispose()

    return asyncio.run(go())


@pytest.mark.slow
def test_worker_runs_an_apps_poll_cycles(migrated_url: str, api_url: str, tmp_path: Path) -> None:
    """`synckit worker --app module:App` schedules and runs the tenants' cycles."""
    add = tenants(migrated_url, "add", "acme", "demo", "--set", "api_token=x", "--app", APP)
    assert add.returncode == 0, add.stderr
    log = tmp_path / "worker.log"
    with open(log, "wb") as stderr:
        worker = subprocess.Popen(
            [*SYNCKIT, "worker", "--app", APP, "--database-url", migrated_url],
            env=env(CONNECTOR_APP_URL=api_url),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        wait_until(
            lambda: _checkpoint(migrated_url) == {"page": 2}, lambda: log.read_text()[-3000:]
        )
    finally:
        stop(worker)
    assert sorted(_Api.posted) == ["r1-0", "r1-1", "r2-0", "r2-1"]
    assert worker.returncode == 0, log.read_text()[-3000:]


@sqlite_only
def test_an_unknown_config_field_is_refused_by_name(migrated_url: str) -> None:
    """A misspelt field is not stored silently: add and set-config refuse it by name."""
    typo = tenants(
        migrated_url,
        "add",
        "acme",
        "demo",
        "--set",
        "api_token=x",
        "--set",
        "pgae_size=5",
        "--app",
        APP,
    )
    assert typo.returncode == 2 and "unknown field 'pgae_size'" in typo.stderr
    assert ls(migrated_url) == []
    assert tenants(migrated_url, "add", "acme", "demo", "--set", "api_token=x", "--app", APP)
    bad = tenants(migrated_url, "set-config", "acme", "--set", "pgae_size=5", "--app", APP)
    assert bad.returncode == 2 and "unknown field 'pgae_size'" in bad.stderr


def _connection(url: str) -> Any:
    from sqlalchemy import select

    from synckit.store.tables import connections

    async def go() -> Any:
        db = open_database(url)
        try:
            async with db.begin() as conn:
                return (await conn.execute(select(connections))).one()
        finally:
            await db.dispose()

    return asyncio.run(go())


@pytest.mark.slow
def test_a_static_key_tenant_refused_with_401_is_fixed_by_set_config_and_syncs(
    migrated_url: str, api_url: str, tmp_path: Path
) -> None:
    """401 -> needs_reauth (reason once) -> set-config (masked) -> resumed -> synced."""
    _Api.required_token = "good-key-0123456789"
    add = tenants(migrated_url, "add", "acme", "demo", "--set", "api_token=bad-key", "--app", APP)
    assert add.returncode == 0, add.stderr
    log = tmp_path / "worker.log"
    with open(log, "wb") as stderr:
        worker = subprocess.Popen(
            [
                *SYNCKIT,
                "worker",
                "--app",
                APP,
                "--database-url",
                migrated_url,
                "--poll-interval",
                "0.2",
            ],
            env=env(CONNECTOR_APP_URL=api_url),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        t = wait_until(
            lambda: (c := _connection(migrated_url)).status == "needs_reauth" and c,
            lambda: log.read_text()[-3000:],
        )
        reason = t.status_reason
        assert "401" in reason and reason.count("needs re-authorisation") <= 1
        refused = tenants(migrated_url, "resume", "acme")
        assert refused.returncode == 2 and "set-config" in refused.stderr

        fixed = tenants(
            migrated_url,
            "set-config",
            "acme",
            "--set",
            f"api_token={_Api.required_token}",
            "--app",
            APP,
        )
        assert fixed.returncode == 0, fixed.stderr
        assert "resumed" in fixed.stdout and "active" in fixed.stdout
        assert _Api.required_token not in fixed.stdout + fixed.stderr  # the secret is masked
        assert _connection(migrated_url).status == "active"
        wait_until(
            lambda: _checkpoint(migrated_url) == {"page": 2}, lambda: log.read_text()[-3000:]
        )
    finally:
        stop(worker)
    assert sorted(_Api.posted) == ["r1-0", "r1-1", "r2-0", "r2-1"]

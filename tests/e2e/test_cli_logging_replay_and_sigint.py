"""Issue 19 item 5, the two cases tests/e2e/test_cli_logging.py leaves out: the worker
acknowledges SIGINT (as SIGTERM) in its log and exits cleanly, and ``synckit dlq replay
--json`` prints valid JSON on stdout while the connector it replays through logs (the
issue's example: ``api_token=supersecretvalue``, which stderr shows redacted)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from engines import sqlite_only  # tests/
from waits import PROCESS_TIMEOUT  # tests/

from synckit.clock import utcnow
from synckit.store.db import open_database
from synckit.store.dead_letters import capture as dlq_capture

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
NOISY_APP = """
import logging

import structlog
from synckit import App, Connector

structlog.get_logger("noisy").info("noisy.loaded", api_token="supersecretvalue")


class Noisy(Connector):
    name = "noisy"

    async def poll(self, ctx, checkpoint):
        yield

    async def handle(self, ctx, record):
        structlog.get_logger("noisy").warning(
            "noisy.handling", record=record["id"], note="api_token=supersecretvalue"
        )
        logging.getLogger("noisy.stdlib").warning("calling with api_token=supersecretvalue")


app = App([Noisy])
"""


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    return {**env, "SYNCKIT_SECRET_KEY": os.environ["SYNCKIT_SECRET_KEY"]}


@sqlite_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_worker_acknowledges_sigint_and_sigterm_and_exits_cleanly(
    tmp_path: Path, migrated_url: str, sig: signal.Signals
) -> None:
    (tmp_path / "noisy_app.py").write_text(NOISY_APP)
    proc = subprocess.Popen(
        [*SYNCKIT, "worker", "--app", "noisy_app:app", "--database-url", migrated_url],
        cwd=tmp_path, env=environment(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    # Read until the worker says it started (a worker that never does exits, ending the
    # stream, or hangs, which pytest-timeout reports).
    started = any("worker.started" in line for line in proc.stderr)
    assert started, "the worker did not start"
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, rest[-3000:]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-3000:]
    events = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    got = [e for e in events if e["event"] == "worker.signal_received"]
    assert got and got[0]["signal"] == sig.name and "grace" in got[0]["action"], rest[-2000:]
    assert events[-1]["event"] == "worker.stopped"


def _seed_dead_letters(url: str, n: int) -> None:
    async def go() -> None:
        db = open_database(url)
        try:
            async with db.begin() as conn:
                await dlq_capture.capture_many(
                    conn,
                    [
                        dlq_capture.Failure(
                            tenant="acme",
                            connector="noisy",
                            kind="record:default",
                            record_id=f"r{i}",
                            payload={"id": f"r{i}"},
                            error_class="server_error",
                            message="HTTP 503 Service Unavailable",
                        )
                        for i in range(n)
                    ],
                    now=utcnow(),
                )
        finally:
            await db.dispose()

    asyncio.run(go())


@sqlite_only
def test_dlq_replay_json_stays_json_while_the_connector_logs_a_secret(
    tmp_path: Path, migrated_url: str
) -> None:
    (tmp_path / "noisy_app.py").write_text(NOISY_APP)
    env = {**environment(), "SYNCKIT_DATABASE_URL": migrated_url}
    add = subprocess.run(
        [*SYNCKIT, "tenants", "add", "acme", "noisy", "--app", "noisy_app:app"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    _seed_dead_letters(migrated_url, 3)
    result = subprocess.run(
        [*SYNCKIT, "dlq", "replay", "--all", "--json", "--app", "noisy_app:app"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # stdout is the summary alone, one JSON document
    assert doc["resolved"] == 3, doc
    assert "supersecretvalue" not in result.stdout + result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    handling = [e for e in events if e["event"] == "noisy.handling"]
    assert len(handling) == 3 and all("api_token=" in e["note"] for e in handling), events
    # The stdlib logger's line is on stderr too, redacted.
    assert any("calling with api_token=" in json.dumps(e) for e in events), result.stderr
    assert "noisy.loaded" in {e["event"] for e in events}

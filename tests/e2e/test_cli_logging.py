"""Every command logs the same way: on stderr, redacted, JSON off a terminal (or as asked),
at the level asked; stdout keeps only the command's output; signals are acknowledged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from engines import sqlite_only  # tests/
from waits import PROCESS_TIMEOUT  # tests/

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
NOISY_APP = """
import structlog
from synckit import App, Connector

structlog.get_logger("noisy").info("noisy.loaded", api_token="supersecretvalue")
structlog.get_logger("noisy").warning("noisy.warned", note="Authorization: Bearer abcdef123456")


class Noisy(Connector):
    name = "noisy"

    async def poll(self, ctx, checkpoint):
        yield

    async def handle(self, ctx, record):
        pass


app = App([Noisy])
"""


def synckit(cwd: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    return subprocess.run(
        [*SYNCKIT, *args], cwd=cwd, env={**env, "SYNCKIT_DATABASE_URL": url},
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT,
    )  # fmt: skip


@sqlite_only
def test_logs_go_to_stderr_redacted_and_json_output_stays_json(
    tmp_path: Path, migrated_url: str
) -> None:
    (tmp_path / "noisy_app.py").write_text(NOISY_APP)
    add = synckit(
        tmp_path, migrated_url, "tenants", "add", "acme", "noisy", "--app", "noisy_app:app"
    )
    assert add.returncode == 0, add.stderr
    result = synckit(tmp_path, migrated_url, "sync", "acme", "--app", "noisy_app:app", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # stdout is the output alone
    assert doc["tenant"] == "acme" and doc["cycles"][0]["stream"] == "default"
    assert "supersecretvalue" not in result.stdout + result.stderr
    assert "abcdef123456" not in result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert {"noisy.loaded", "noisy.warned"} <= {e["event"] for e in events}

    quiet = synckit(
        tmp_path, migrated_url, "--log-level", "warning", "--log-format", "console",
        "sync", "acme", "--app", "noisy_app:app", "--json",
    )  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr
    assert "noisy.loaded" not in quiet.stderr and "noisy.warned" in quiet.stderr
    assert not any(line.startswith("{") for line in quiet.stderr.splitlines())
    json.loads(quiet.stdout)


@sqlite_only
def test_the_worker_acknowledges_each_signal_in_its_log(tmp_path: Path, migrated_url: str) -> None:
    (tmp_path / "noisy_app.py").write_text(NOISY_APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    proc = subprocess.Popen(
        [*SYNCKIT, "worker", "--app", "noisy_app:app", "--database-url", migrated_url],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    assert any("worker.started" in line for line in proc.stderr), "the worker did not start"
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=PROCESS_TIMEOUT)
    events = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    got = [e for e in events if e["event"] == "worker.signal_received"]
    assert got and got[0]["signal"] == "SIGTERM" and "grace" in got[0]["action"], rest[-2000:]
    assert proc.returncode == 0
    assert events[-1]["event"] == "worker.stopped"

"""Helpers to run `synckit worker` as real OS processes in tests."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from waits import PROCESS_TIMEOUT, wait_until

APPS = Path(__file__).parent / "apps"
_seq = itertools.count()
#: Where each spawned worker's stderr (its log) goes, by pid.
_stderr: dict[int, Path] = {}


def spawn_worker(
    url: str,
    log_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    app: str = "queue_app:registry",
) -> subprocess.Popen[bytes]:
    """Start `synckit worker --app APP` (default queue_app:registry) on ``url``.

    Its log goes to a file beside ``log_path``: a pipe nobody reads would fill up and
    block the worker.
    """
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "QUEUE_APP_LOG": str(log_path),
        **(env or {}),
    }
    stderr_path = log_path.parent / f"worker-{next(_seq)}.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "synckit.cli",
                "worker",
                "--app",
                app,
                "--database-url",
                url,
                *args,
            ],
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    _stderr[proc.pid] = stderr_path
    return proc


def worker_log(proc: subprocess.Popen[bytes]) -> str:
    """What a worker ``spawn_worker`` started has logged so far."""
    return _stderr[proc.pid].read_text(errors="replace")


def wait_started(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Until every worker has logged ``worker.started`` (imported, connected, claiming);
    fails at once if one exits, and after EVENT_TIMEOUT if one never starts."""

    def started() -> bool:
        for p in procs:
            assert p.poll() is None, f"a worker exited: {worker_log(p)[-3000:]}"
        return all("worker.started" in worker_log(p) for p in procs)

    wait_until(started, lambda: "\n".join(worker_log(p)[-2000:] for p in procs))


def read_log(path: Path) -> list[tuple[str, int, int, float, float]]:
    """The executions recorded by queue_app: (kind, job id, pid, start, end)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        kind, job_id, pid, start, end = line.split()
        out.append((kind, int(job_id), int(pid), float(start), float(end)))
    return out


def read_begun(path: Path) -> list[int]:
    """The ids of the sleeping ``record`` jobs whose handlers have begun (queue_app)."""
    begun = path.with_name(path.name + ".begun")
    return [int(x) for x in begun.read_text().split()] if begun.exists() else []


def stop_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float = PROCESS_TIMEOUT) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

"""Issue 34, workers: worker processes register and heartbeat; one gone silent is lost;
``synckit workers ls`` and the console's Workers page show them; on both engines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from synckit.clock import utcnow
from synckit.store import workers
from synckit.store.db import Database

APPS = Path(__file__).resolve().parents[1] / "apps"


async def test_register_beat_stop_and_lost(db: Database) -> None:
    now = utcnow()
    kw = {"host": "h1", "pid": 42, "version": "1.2.3", "concurrency": 8, "heartbeat_seconds": 5.0}
    await workers.register(db, "w-a", now=now, **kw)
    await workers.register(db, "w-b", now=now, **kw)
    await workers.register(db, "w-c", now=now, **kw)
    assert await workers.beat(db, "w-a", in_flight=3, now=now + timedelta(seconds=14))
    await workers.stopped(db, "w-c", now=now + timedelta(seconds=1))
    later = now + timedelta(seconds=16)  # w-b silent 16 s > 3 x 5 s
    found = {w.worker_id: w for w in await workers.list_workers(db, now=later)}
    assert {k: w.state for k, w in found.items()} == {
        "w-a": "alive",
        "w-b": "lost",
        "w-c": "stopped",
    }
    assert found["w-a"].in_flight == 3 and found["w-a"].host == "h1"
    assert found["w-a"].pid == 42 and found["w-a"].concurrency == 8
    assert await workers.alive_count(db, now=later) == 1
    assert not await workers.beat(db, "w-gone", in_flight=0, now=later)


async def test_a_killed_worker_process_is_listed_then_marked_lost(migrated_url: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
    }
    cli = [sys.executable, "-m", "synckit.cli"]
    args = ["--app", "web_app:app", "--database-url", migrated_url, "--presence-every", "0.5"]
    worker = subprocess.Popen(  # noqa: ASYNC220 - started once, waited for off the loop
        [*cli, "worker", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def ls() -> list[dict[str, object]]:
        proc = await asyncio.create_subprocess_exec(
            *cli, "workers", "ls", "--json", "--database-url", migrated_url,
            env=env, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        listed: list[dict[str, object]] = json.loads(out)
        return listed

    async def until(state: str, budget: float = 60.0) -> dict[str, object]:
        async with asyncio.timeout(budget):
            while True:
                rows = [w for w in await ls() if w["pid"] == worker.pid]
                if rows and rows[0]["state"] == state:
                    return rows[0]
                await asyncio.sleep(0.3)

    try:
        alive = await until("alive")
        assert alive["concurrency"] == 10 and alive["lost_after_seconds"] == 1.5
        worker.send_signal(signal.SIGKILL)
        await asyncio.to_thread(worker.wait, 30)
        lost = await until("lost")
        assert lost["stopped_at"] is None
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

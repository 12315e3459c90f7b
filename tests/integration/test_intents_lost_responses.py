"""Lost responses and killed workers: intent-first writes create every resource exactly once.

A fake API on loopback commits each create and then, 30% of the time (at most three
times per item), closes the connection without answering. Three `synckit worker`
processes run 100 write jobs while workers are killed with SIGKILL and replaced. With
``find``, every intended item exists exactly once; the very same run with blind retries
(no ``find``) makes duplicates, which shows that find-first is what prevents them.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT  # tests/

from synckit.runtime.writes.intents import write_job
from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing
from synckit.store.tables import intents, jobs

APPS = Path(__file__).parent.parent / "apps"
INTENDED = 100
DROP_RATE = 0.3
WORKERS = 3
KILLS = 3
MAX_DROPS = 3


class FakeApi:
    """POST /items commits an item, then answers or (``drop_rate``) drops the connection.

    GET /items?ref=... lists the items with that ref.
    """

    def __init__(self, drop_rate: float, seed: int) -> None:
        self.drop_rate = drop_rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.items: list[dict[str, Any]] = []
        self.dropped = 0
        self.drops: collections.Counter[str] = collections.Counter()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with api.lock:
                    latency = api.rng.uniform(0.02, 0.08)
                time.sleep(latency)  # a kill -9 can land while the create is in flight
                with api.lock:
                    item = {"id": len(api.items) + 1, "ref": body["ref"]}
                    api.items.append(item)  # committed
                    # At most MAX_DROPS per item: the transient class allows 8 attempts,
                    # and a job's attempts are also spent by the kills.
                    drop = api.rng.random() < api.drop_rate and api.drops[body["ref"]] < MAX_DROPS
                    api.drops[body["ref"]] += drop
                    api.dropped += drop
                time.sleep(latency)
                if drop:
                    self.close_connection = True  # and no response at all
                    return
                self._send(201, item)

            def do_GET(self) -> None:
                ref = parse_qs(urlsplit(self.path).query).get("ref", [""])[0]
                with api.lock:
                    found = [i for i in api.items if i["ref"] == ref]
                self._send(200, {"items": found})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def per_ref(self) -> collections.Counter[str]:
        with self.lock:
            return collections.Counter(i["ref"] for i in self.items)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    a = FakeApi(DROP_RATE, seed=7)
    a.thread.start()
    try:
        yield a
    finally:
        a.server.shutdown()
        a.server.server_close()


def spawn(url: str, api_url: str, find: bool, tmp_path: Path, n: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "SYNCKIT_DATABASE_URL": url,
        "INTENTS_API_URL": api_url,
        "INTENTS_APP_FIND": "1" if find else "0",
    }
    with open(tmp_path / f"worker-{n}.stderr", "wb") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "synckit.cli",
                "worker",
                "--app",
                "intents_app:registry",
                "--database-url",
                url,
                "--concurrency",
                "4",
                "--lease",
                "2s",
                "--poll-interval",
                "0.1",
                "--grace",
                "1",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def rescued_jobs(tmp_path: Path) -> int:
    """Jobs the workers rescued from killed workers, from their JSON-lines logs."""
    total = 0
    for path in tmp_path.glob("worker-*.stderr"):
        for line in path.read_text().splitlines():
            if '"job.leases_rescued"' in line:
                total += json.loads(line)["jobs"]
    return total


async def pids_holding_jobs(db: Database) -> set[int]:
    """The worker processes that hold running jobs (a worker id is host:pid:random)."""
    async with db.begin() as conn:
        rows = await conn.execute(select(jobs.c.locked_by).where(jobs.c.status == "running"))
        return {int(w.rsplit(":", 2)[1]) for (w,) in rows if w}


async def unfinished(db: Database) -> int:
    counts = await admin.count_by_status(db)
    return counts.get("pending", 0) + counts.get("running", 0)


async def chaos_run(
    db: Database, url: str, api: FakeApi, tmp_path: Path, *, find: bool
) -> dict[str, Any]:
    """Run the writes with lost responses and killed workers; what happened."""
    await enqueueing.enqueue_many(
        db,
        [
            write_job(
                tenant="acme",
                connector="demo",
                key=f"item-{i}",
                request={"ref": f"item-{i}"},
                max_attempts=25,
            )
            for i in range(INTENDED)
        ],
    )
    rng = random.Random(11)
    loop = asyncio.get_running_loop()
    workers = [spawn(url, api.url, find, tmp_path, n) for n in range(WORKERS)]
    spawned, killed = WORKERS, 0
    # The whole run, kills and rescues included (about 15 s on a quiet machine).
    deadline = loop.time() + 2 * EVENT_TIMEOUT
    try:
        while await unfinished(db):
            assert loop.time() < deadline, "the writes never finished"
            # Only a worker holding jobs is worth killing: its jobs must then be rescued.
            holders = await pids_holding_jobs(db) if killed < KILLS else set()
            busy = [w for w in workers if w.pid in holders]
            if busy:
                victim = rng.choice(busy)
                workers.remove(victim)
                os.kill(victim.pid, signal.SIGKILL)
                await asyncio.to_thread(victim.wait, PROCESS_TIMEOUT)
                killed += 1
                workers.append(spawn(url, api.url, find, tmp_path, spawned))
                spawned += 1
            await asyncio.sleep(0.3)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                await asyncio.to_thread(w.wait, PROCESS_TIMEOUT)
            except subprocess.TimeoutExpired:
                w.kill()
    async with db.begin() as conn:
        rows = list(await conn.execute(select(intents)))
    per_ref = api.per_ref()
    return {
        "killed": killed,
        "rescued": rescued_jobs(tmp_path),
        "dropped": api.dropped,
        "statuses": await admin.count_by_status(db),
        "per_ref": per_ref,
        "duplicates": sum(n - 1 for n in per_ref.values()),
        "intents": rows,
        "items": {i["ref"]: i["id"] for i in api.items},
    }


async def test_with_find_every_resource_is_created_exactly_once(
    db: Database, migrated_url: str, api: FakeApi, tmp_path: Path
) -> None:
    """30% lost responses + kill -9: 0 duplicates, every item created once, ids recorded."""
    run = await chaos_run(db, migrated_url, api, tmp_path, find=True)
    # The chaos happened: responses were lost, and kills caught jobs mid-flight.
    assert run["killed"] == KILLS and run["rescued"] > 0 and run["dropped"] >= 15
    assert run["statuses"] == {"succeeded": INTENDED}
    assert run["duplicates"] == 0
    assert run["per_ref"] == {f"item-{i}": 1 for i in range(INTENDED)}
    rows = run["intents"]
    assert len(rows) == INTENDED and {r.status for r in rows} == {"done"}
    assert {r.intent_key: r.remote_id for r in rows} == {
        ref: str(item_id) for ref, item_id in run["items"].items()
    }
    assert sum(r.attempts > 1 for r in rows) >= 15  # that many lost outcomes were found


async def test_without_find_blind_retries_duplicate(
    db: Database, migrated_url: str, api: FakeApi, tmp_path: Path
) -> None:
    """The same run with blind retries: duplicates, so find-first is what prevents them."""
    run = await chaos_run(db, migrated_url, api, tmp_path, find=False)
    assert run["dropped"] >= 15
    assert run["statuses"] == {"succeeded": INTENDED}
    assert set(run["per_ref"]) == {f"item-{i}" for i in range(INTENDED)}
    # Each lost response left an item the retry did not know of: one duplicate apiece.
    assert run["duplicates"] >= run["dropped"] > 0

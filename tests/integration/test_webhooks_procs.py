"""Several OS processes process one tenant's inbox at once: each event reaches
``on_webhook`` exactly once and ends processed (both engines)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from sqlalchemy import Connection
from waits import PROCESS_TIMEOUT  # tests/

from synckit.clock import utcnow
from synckit.runtime.admin.tenants import add_tenant
from synckit.store import webhooks as inbox
from synckit.store.db import Database

APP = Path(__file__).parents[1] / "apps" / "webhooks_app.py"
EVENTS = 400
PROCESSES = 3

sys.path.insert(0, str(APP.parent))
import webhooks_app  # noqa: E402  # tests/apps


def _run_processes(url: str, log: Path) -> None:
    env = {**os.environ, "WEBHOOKS_APP_LOG": str(log)}
    procs = [
        subprocess.Popen([sys.executable, str(APP), url, "t1"], env=env, stderr=subprocess.PIPE)
        for _ in range(PROCESSES)
    ]
    for p in procs:
        _, err = p.communicate(timeout=PROCESS_TIMEOUT)
        assert p.returncode == 0, err.decode()[-2000:]


async def test_concurrent_processes_hand_each_event_to_the_hook_once(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    now = utcnow()
    events = [(f"evt_{i}", b"{}") for i in range(EVENTS)]

    def seed(conn: Connection) -> None:
        for start in range(0, EVENTS, 50):
            inbox.store_events(
                conn,
                connector="logged",
                tenant="t1",
                events=events[start : start + 50],
                headers={},
                now=now,
            )

    await db.write(seed)
    await add_tenant(db, "t1", "logged", {"webhook_secret": "whsec_x"}, app=webhooks_app.app)
    log = tmp_path / "hook.log"
    await asyncio.to_thread(_run_processes, migrated_url, log)
    seen = Counter(line.split()[1] for line in log.read_text().splitlines())
    assert set(seen) == {e for e, _ in events}
    assert max(seen.values()) == 1, [e for e, n in seen.items() if n > 1][:5]
    counts = {(r.connector, r.tenant): r for r in await db.run_read(inbox.webhook_counts)}
    assert (counts[("logged", "t1")].processed, counts[("logged", "t1")].pending) == (EVENTS, 0)

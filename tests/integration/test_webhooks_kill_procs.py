"""Issue 33's crash test, both engines: a loopback sender posts signed deliveries for 20
tenants (10% of them repeated, 1% with a bad signature) to a web process, while worker
processes are killed with kill -9 (and replaced) and the web process is killed and
restarted once. Every acknowledged event is stored once and processed once (its record
landed, its processed mark committed with it), none with a bad signature is stored,
and no 2xx was given for an event that was not stored.

``SYNCKIT_WEBHOOK_KILL_DELIVERIES`` sets the number of deliveries (default 300, to keep
the suite fast; the issue's 10,000 is run by hand with it).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT, await_until  # tests/

from synckit.connectors.webhooks import sign_stripe
from synckit.store import webhooks as inbox
from synckit.store.db import Database

APPS = Path(__file__).parents[1] / "apps"
sys.path.insert(0, str(APPS))
import webhooks_app  # noqa: E402  # tests/apps

DELIVERIES = int(os.environ.get("SYNCKIT_WEBHOOK_KILL_DELIVERIES", "300"))
TENANTS = 20
SENDERS = 8
WORKERS = 2
CONNECTOR = webhooks_app.Landed.name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    """The web process and the workers, started and killed by this test."""

    def __init__(self, url: str, port: int, logs: Path) -> None:
        self.url, self.port, self.logs = url, port, logs
        self.web: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.n = 0

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        self.n += 1
        out = open(self.logs / f"proc{self.n}.log", "wb")  # noqa: SIM115  # the child's
        return subprocess.Popen(args, cwd=APPS, stdout=out, stderr=subprocess.STDOUT)

    def start_web(self) -> None:
        self.web = self._spawn(
            [sys.executable, str(APPS / "webhooks_app.py"), "--serve", self.url, str(self.port)]
        )

    def start_worker(self) -> None:
        synckit = str(Path(sys.executable).with_name("synckit"))
        self.workers.append(
            self._spawn(
                [
                    synckit,
                    "worker",
                    "--app",
                    "webhooks_app:app",
                    "--database-url",
                    self.url,
                    "--lease",
                    "3s",
                    "--poll-interval",
                    "0.2",
                    "--concurrency",
                    "4",
                    "--presence-every",
                    "1",
                ]
            )
        )

    def kill(self, p: subprocess.Popen[bytes]) -> None:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=PROCESS_TIMEOUT)

    def stop_all(self) -> None:
        for p in [*self.workers, *([self.web] if self.web else [])]:
            if p.poll() is None:
                self.kill(p)


def _deliveries() -> list[tuple[int, str, bool]]:
    """(tenant, event id, signed right) in sending order: 10% repeat an earlier event,
    1% carry a bad signature (events of their own, never to be stored)."""
    rnd = random.Random(33)
    out: list[tuple[int, str, bool]] = []
    for i in range(DELIVERIES):
        if out and rnd.random() < 0.10:
            t, eid, good = rnd.choice(out)
            out.append((t, eid, good))
        else:
            out.append((i % TENANTS, f"evt_{i}", rnd.random() >= 0.01))
    return out


async def _send(port: int, deliveries: list[tuple[int, str, bool]], procs: Procs) -> dict[str, int]:
    """Post every delivery as a provider would: retried on a transport error or a 5xx
    until answered 2xx or 401. The final answer per delivery index."""
    answers: dict[int, int] = {}
    queue = iter(enumerate(deliveries))
    done = 0
    restarted = False
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        async def one(i: int, tenant: int, eid: str, good: bool) -> None:
            body = json.dumps({"id": eid, "data": {"id": eid, "n": i}}).encode()
            secret = f"whsec_kill_{tenant}" if good else "whsec_wrong"
            while True:
                headers = {"Stripe-Signature": sign_stripe(secret, int(time.time()), body)}
                try:
                    r = await client.post(f"/{CONNECTOR}/t{tenant}", content=body, headers=headers)
                except httpx.TransportError:
                    await asyncio.sleep(0.05)  # the web process is down: the provider retries
                    continue
                if r.status_code < 500:
                    answers[i] = r.status_code
                    return
                await asyncio.sleep(0.05)

        async def sender() -> None:
            nonlocal done, restarted
            for i, (tenant, eid, good) in queue:
                await one(i, tenant, eid, good)
                done += 1
                if done % max(1, DELIVERIES // 8) == 0:
                    # kill -9 a worker mid-flight, and start another in its place
                    victim = procs.workers.pop(random.randrange(len(procs.workers)))
                    procs.kill(victim)
                    procs.start_worker()
                if not restarted and done >= DELIVERIES // 2:
                    restarted = True
                    assert procs.web is not None
                    procs.kill(procs.web)
                    procs.start_web()

        await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return {str(k): v for k, v in answers.items()}


async def test_killed_workers_and_web_process_lose_nothing_and_process_each_event_once(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    app = webhooks_app.app
    await app.upgrade_records(db)
    for t in range(TENANTS):
        await app.add_tenant(db, f"t{t}", CONNECTOR, {"webhook_secret": f"whsec_kill_{t}"})
    deliveries = _deliveries()
    port = _free_port()
    procs = Procs(migrated_url, port, tmp_path)
    procs.start_web()
    for _ in range(WORKERS):
        procs.start_worker()
    try:
        answers = await _send(port, deliveries, procs)

        async def all_processed() -> bool:
            c = [x for x in await db.run_read(inbox.webhook_counts) if x.connector == CONNECTOR]
            return sum(x.pending for x in c) == 0 and sum(x.received for x in c) > 0

        def logs() -> str:
            return "\n".join(p.read_text()[-1500:] for p in sorted(tmp_path.glob("proc*.log")))

        await await_until(
            all_processed, lambda: "events left pending:\n" + logs(), EVENT_TIMEOUT * 2
        )
    finally:
        procs.stop_all()
    acked = {deliveries[int(i)][1] for i, code in answers.items() if code == 200}
    refused = {deliveries[int(i)][1] for i, code in answers.items() if code == 401}
    assert len(answers) == DELIVERIES
    assert set(answers.values()) <= {200, 401}, sorted(set(answers.values()))
    bad = {eid for _, eid, good in deliveries if not good}
    assert refused == bad and not (acked & bad)
    rows = [e for e in await db.run_read(lambda c: inbox.recent_events(c, limit=DELIVERIES * 2))]
    stored = [e.event_id for e in rows]
    assert len(stored) == len(set(stored)), "an event stored twice"
    assert set(stored) == acked, (sorted(acked - set(stored))[:5], sorted(set(stored) - acked)[:5])
    assert {e.status for e in rows} == {"processed"}
    by_tenant: dict[str, set[str]] = {}
    for t in range(TENANTS):
        got = await app.records(f"t{t}", "items", connector=CONNECTOR, db=db).rows(limit=DELIVERIES)
        by_tenant[f"t{t}"] = {r["id"] for r in got}
    expected: dict[str, set[str]] = {f"t{t}": set() for t in range(TENANTS)}
    for t, eid, good in deliveries:
        if good:
            expected[f"t{t}"].add(eid)
    assert by_tenant == expected
    # Retries and repeats: the provider's duplicates were answered 2xx and stored once.
    counts = [x for x in await db.run_read(inbox.webhook_counts) if x.connector == CONNECTOR]
    assert sum(x.duplicates for x in counts) >= sum(1 for _, e, g in deliveries if g) - len(acked)
    assert sum(x.refused for x in counts) >= len(bad)

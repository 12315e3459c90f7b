"""A 402 with a JSON error body puts the provider's message in the dead letter when the
cycles run in 3 worker processes, on both engines (the in-process variants are in
test_api_errors.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from loopback import LoopbackServer, Request  # type: ignore[import-not-found]
from procs import spawn_worker, stop_all  # type: ignore[import-not-found]

from synckit.runtime.admin.tenants import add_tenant
from synckit.runtime.sync.scheduler import poll_job_spec
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.testing import dead_letters
from tests.apps.payments_app import app

TENANTS = [f"t{i}" for i in range(6)]
#: A generous bound on the whole run on a busy machine (waited for by event, not slept).
BUDGET = 180.0
DECLINED = {
    "error": {
        "type": "card_error",
        "code": "card_declined",
        "message": "Your card has insufficient funds.",
    }
}


def respond(req: Request) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if req.method == "GET":
        tenant = req.path.split("tenant=")[-1]
        data = [{"id": f"{tenant}-c{i}"} for i in range(4)]
        return 200, headers, json.dumps({"data": data}).encode()
    return 402, headers, json.dumps(DECLINED).encode()


async def test_three_workers_dead_letter_every_declined_invoice_with_its_message(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Every invoice is declined: 24 dead letters, each reading "HTTP 402 Payment
    Required: card_error/card_declined: Your card has insufficient funds."."""
    api = LoopbackServer(respond)
    try:
        for t in TENANTS:
            await add_tenant(db, t, "payments", app=app)
        await enqueueing.enqueue_many(
            db, [poll_job_spec(t, "payments", "default", f"payments:{t}") for t in TENANTS]
        )
        env = {"PAYMENTS_API_URL": api.url}
        procs = [
            spawn_worker(migrated_url, tmp_path / "log", "--poll-interval", "0.05", env=env,
                         app="payments_app:app")
            for _ in range(3)
        ]  # fmt: skip
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + BUDGET
            while len(rows := await dead_letters(db)) < 4 * len(TENANTS):
                assert loop.time() < deadline, f"{len(rows)} dead letters after {BUDGET}s"
                await asyncio.sleep(0.2)
        finally:
            stop_all(procs)
    finally:
        api.close()
    assert {r.record_id for r in rows} == {f"{t}-c{i}" for t in TENANTS for i in range(4)}
    for r in rows:
        assert r.error_class == "validation", (r.record_id, r.error_class, r.error_message)
        assert (
            "HTTP 402 Payment Required: card_error/card_declined: "
            "Your card has insufficient funds." in r.error_message
        ), r.error_message

"""Secrets an API echoes, in every audited shape, reach no stored row, log line, CLI
output or alert body: the worker's recording, the DLQ capture, both engines."""

from __future__ import annotations

import io
import json

from secret_shapes import SHAPES
from sqlalchemy import select

from synckit.errors import RetryPolicy
from synckit.runtime.alerts import Alert
from synckit.runtime.handlers import JobContext, Registry
from synckit.runtime.logging import configure_logging
from synckit.runtime.worker import Worker
from synckit.store import jobs as store
from synckit.store.db import Database
from synckit.store.jobs import JobSpec
from synckit.store.tables import dead_letters, jobs, resources


def secret_for(n: int) -> str:
    return f"Zq{n:03d}SeCrEtXyZ{n:03d}abcdef"


async def test_worker_recording_and_dlq_capture_store_no_secret(db: Database) -> None:
    """Each job fails with an error quoting its own secret in one shape (message and
    traceback); jobs, dead_letters and resources (the breaker's last error), dumped
    whole, and the worker's log hold none."""
    reg = Registry()
    names = sorted(SHAPES)

    @reg.handler("leaky", max_attempts=1)
    async def leaky(ctx: JobContext) -> None:
        n = ctx.payload["n"]
        raise RuntimeError(SHAPES[names[n]](secret_for(n)))

    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    try:
        specs = [JobSpec("leaky", {"n": n}, resource_key=f"leaky:{n}") for n in range(len(names))]
        await store.enqueue_many(db, specs)
        worker = Worker(db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
        stats = await worker.run_until_idle()
    finally:
        configure_logging(json_lines=True, stream=io.StringIO())
    assert stats.dead == len(names)
    async with db.begin() as conn:
        rows = [dict(r._mapping) for r in await conn.execute(select(jobs))]
        rows += [dict(r._mapping) for r in await conn.execute(select(dead_letters))]
        stored = [dict(r._mapping) for r in await conn.execute(select(resources))]
    assert sum(1 for r in stored if r["last_error"]) == len(names)
    rows += stored
    dump = json.dumps(rows, default=str) + out.getvalue()
    leaked = [names[n] for n in range(len(names)) if secret_for(n) in dump]
    assert leaked == []
    assert sum(1 for r in rows if r.get("record_id", "").startswith("job:")) == len(names)


def test_alert_bodies_are_redacted() -> None:
    """What a webhook receives (Alert.to_json) carries no secret in message or details."""
    from datetime import UTC, datetime

    for n, name in enumerate(sorted(SHAPES)):
        text = SHAPES[name](secret_for(n))
        alert = Alert("r", "s", text, datetime.now(UTC), "w", details={"reason": text})
        assert secret_for(n) not in json.dumps(alert.to_json()), name

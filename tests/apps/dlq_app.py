"""An application for the DLQ's subprocess tests: `synckit dlq replay --app dlq_app:app`.

``App.replay_record`` appends one line per replay to ``$DLQ_APP_LOG``
(``tenant kind id pid``) and fails on demand: a payload ``{"fail": "transient"}`` raises
a retryable error, ``{"fail": "validation"}`` a permanent one, and the connector
``unknown`` is :class:`Unreplayable`. Lines this short are written atomically with
O_APPEND, so several processes can share the file.

Run as a script (``python dlq_app.py URL LOG [BARRIER_DIR]``), it is one replay process of
the concurrency test: it waits until two processes are ready (files in BARRIER_DIR), then
drains the due rows with a :class:`ReplayProcessor` whose replayer logs ``row_id pid`` and
sleeps a little, so that two such processes overlap.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from synckit.dlq import Replayers, ReplayProcessor
from synckit.errors.exceptions import PermanentError, RetryableError, Unreplayable
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.store.db import Database, open_database
from synckit.store.dead_letters.rows import DeadLetter


def _append(line: str) -> None:
    path = os.environ.get("DLQ_APP_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


registry = Registry()


@registry.handler("sync_job")
async def sync_job(ctx: JobContext) -> None:
    _append(f"job {ctx.job.id} {os.getpid()}")


class App:
    """What the connectors' App offers the DLQ: ``replay_record`` and a job registry."""

    registry = registry

    async def replay_record(
        self, db: Database, tenant: str, connector: str, kind: str, payload: Any
    ) -> None:
        if connector == "unknown":
            raise Unreplayable(f"unknown connector {connector!r}")
        fail = payload.get("fail")
        if fail == "transient":
            raise RetryableError("remote said 503")
        if fail == "validation":
            raise PermanentError("remote said 422")
        _append(f"{tenant} {kind} {payload.get('id')} {os.getpid()}")


app = App()


async def _drain(url: str, barrier: Path | None) -> None:
    db = open_database(url)
    await db.check()  # connected and ready before the start line
    if barrier is not None:
        # A start line: the test's processes begin together, so they really compete.
        (barrier / f"ready-{os.getpid()}").touch()
        for _ in range(600):
            if len(os.listdir(barrier)) >= 2:
                break
            await asyncio.sleep(0.05)

    async def replay(row: DeadLetter) -> None:
        _append(f"{row.id} {os.getpid()}")
        await asyncio.sleep(0.01)

    replayers = Replayers()
    replayers.register_prefix("record:", replay)
    processor = ReplayProcessor(db, replayers, batch=5, concurrency=2)
    idle = 0
    try:
        while idle < 3:
            summary = await processor.run_once(limit=20)
            idle = idle + 1 if summary.claimed == 0 else 0
            if summary.claimed == 0:
                await asyncio.sleep(0.05)
    finally:
        await db.dispose()


if __name__ == "__main__":
    os.environ["DLQ_APP_LOG"] = sys.argv[2]
    asyncio.run(_drain(sys.argv[1], Path(sys.argv[3]) if len(sys.argv) > 3 else None))

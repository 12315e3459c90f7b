"""Handlers the queue's multi-process tests run in `synckit worker` subprocesses.

Each execution appends one line to ``$QUEUE_APP_LOG``: ``kind job_id pid start end``.
Lines this short are written atomically with O_APPEND, so several processes can share it.
A ``record`` job that sleeps also appends ``job_id`` to ``$QUEUE_APP_LOG.begun`` as its
handler begins: a row marked running may be a job whose handler has not begun yet.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta

from synckit.runtime.jobs.handlers import JobContext, Registry

registry = Registry()


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _record(ctx: JobContext, start: float) -> None:
    line = f"{ctx.job.kind} {ctx.job.id} {os.getpid()} {start:.6f} {time.time():.6f}\n"
    _append(os.environ["QUEUE_APP_LOG"], line)


@registry.handler("record")
async def record(ctx: JobContext) -> None:
    start = time.time()
    seconds = float((ctx.payload or {}).get("sleep", 0))
    if seconds:
        _append(os.environ["QUEUE_APP_LOG"] + ".begun", f"{ctx.job.id}\n")
        await asyncio.sleep(seconds)
    _record(ctx, start)


@registry.handler("tick")
async def tick(ctx: JobContext) -> None:
    _record(ctx, time.time())


if os.environ.get("QUEUE_APP_CRON") == "1":
    registry.recurring("every-second", "tick", every=timedelta(seconds=1))


@registry.handler("crash")
async def crash(ctx: JobContext) -> None:
    """Kills its own worker, as a job that segfaults an extension would."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)

"""A queue app whose worker subprocesses trace: each span goes, as it ends, to the JSON
lines file ``$TRACED_APP_SPANS`` (tests/otel_spans.py's file exporter). ``parent``
enqueues a ``child`` follow-up (due in an hour: the test moves it, so that another
process runs it)."""

from __future__ import annotations

import os
from datetime import timedelta

from otel_spans import file_tracing  # tests/

from synckit.runtime.jobs.handlers import JobContext, Registry

file_tracing(os.environ["TRACED_APP_SPANS"])

registry = Registry()


@registry.handler("parent")
async def parent(ctx: JobContext) -> None:
    ctx.log.info("parent.ran")
    ctx.enqueue("child", {"from": ctx.job.id}, delay=timedelta(hours=1))


@registry.handler("child")
async def child(ctx: JobContext) -> None:
    ctx.log.info("child.ran")

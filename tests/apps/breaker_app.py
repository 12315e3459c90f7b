"""A worker app whose jobs call a loopback API and let synckit classify the answers."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import httpx

from synckit.errors import BreakerPolicy, RetryPolicy, classify
from synckit.errors.raising import exception_for
from synckit.runtime.http.transports import tls_context
from synckit.runtime.jobs.handlers import JobContext, Registry

registry = Registry(
    breaker_policy=BreakerPolicy(failure_threshold=3, cooldown=timedelta(seconds=2)),
    retry_policy=RetryPolicy(
        base=timedelta(milliseconds=200),
        cap=timedelta(milliseconds=400),
        floor=timedelta(milliseconds=100),
    ),
)


@registry.handler("call", timeout=10)
async def call(ctx: JobContext) -> None:
    async with httpx.AsyncClient(
        base_url=os.environ["BREAKER_APP_API"], timeout=5, verify=tls_context()
    ) as http:
        response = await http.get(ctx.payload["path"], headers={"X-Job": str(ctx.job.id)})
    if response.is_success:
        return
    raise exception_for(classify(response=response, now=datetime.now(UTC)))

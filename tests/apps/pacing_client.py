"""Sends requests through ctx.http from its own OS process (tests/integration/test_pacing.py).

Usage: python pacing_client.py DB_URL BASE_URL REQUESTS CONCURRENCY. Prints one line of
JSON: the status of every request as the client saw it (429s it waited out inline count
as 200 here; the server counts every 429 it sent).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta

from synckit import Connector
from synckit.errors.exceptions import RateLimited
from synckit.runtime.sync.context import open_context
from synckit.store.db import open_database


class Quota(Connector):
    name = "quota"
    max_inline_wait = timedelta(seconds=10)


async def main(url: str, base_url: str, requests: int, concurrency: int) -> None:
    db = open_database(url)
    connector = type("QuotaHere", (Quota,), {"base_url": base_url})("acme", {})
    statuses: list[int] = []
    try:
        async with open_context(db, connector, resource_key="quota:acme") as ctx:
            queue = list(range(requests))

            async def run() -> None:
                while queue:
                    queue.pop()
                    try:
                        statuses.append((await ctx.http.get("/items")).status_code)
                    except RateLimited:
                        statuses.append(429)

            await asyncio.gather(*(run() for _ in range(concurrency)))
    finally:
        await db.dispose()
    print(json.dumps(statuses))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))

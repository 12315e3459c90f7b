"""One cycle of the far shop (records_app.far_app), killed by SIGKILL right after the
N-th page's transaction in the records' database committed, before the runtime's:

    python records_far.py RUNTIME_URL FAR_URL TENANT N

``$RECORDS_APP_URL`` is the orders API."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import records_app

import synckit.runtime.sync.poll as poll
from synckit.store.db import open_database

runtime_url, far_url, tenant, after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
real_destination = poll.records_destination
landed = 0


class Crashing:
    """The records' database, killing this process once its N-th page committed there."""

    def __init__(self, far: Any) -> None:
        self.far = far

    def __getattr__(self, name: str) -> Any:
        return getattr(self.far, name)

    async def write(self, fn: Any, *args: Any) -> Any:
        global landed
        out = await self.far.write(fn, *args)
        if fn is poll._land_elsewhere:
            landed += 1
            if landed == after:
                os.kill(os.getpid(), signal.SIGKILL)  # committed there, not here
        return out


def destination(decl: Any) -> Any:
    far = real_destination(decl)
    return None if far is None else Crashing(far)


poll.records_destination = destination


async def main() -> None:
    db = open_database(runtime_url)
    try:
        await records_app.far_app(far_url).poll(db, tenant, "orders")
    finally:
        await db.dispose()


asyncio.run(main())

"""One step of an OAuth refresh's lease in its own OS process, for the fenced-finish tests:

``python refresh_lease.py URL take TENANT OWNER NOW_ISO UNTIL_ISO`` prints whether OWNER
took the refresh lease; ``python refresh_lease.py URL save TENANT OWNER NOW_ISO TOKEN``
prints whether OWNER could store TOKEN (as the sealed set) and end its lease."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime

from synckit.store import connections
from synckit.store.db import open_database


async def main(url: str, step: str, tenant: str, owner: str, now_iso: str, arg: str) -> None:
    now = datetime.fromisoformat(now_iso)
    db = open_database(url)
    try:
        async with db.begin() as conn:
            if step == "take":
                until = datetime.fromisoformat(arg)
                done = await connections.take_refresh_lease(
                    conn, tenant, owner=owner, until=until, now=now
                )
            else:
                done = await connections.save_refreshed_token_set(
                    conn, tenant, sealed=arg.encode(), expires_at=None, owner=owner, now=now
                )
        print(json.dumps(done))
    finally:
        await db.dispose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))

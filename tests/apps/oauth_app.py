"""One process of the OAuth refresh race (tests/integration/test_oauth_race.py).

Runs ``--tasks`` concurrent jobs, each with its own ``OAuth2Auth`` and HTTP client (as
each job of a worker gets its own context), that call the protected resource once. It
opens its database connections, writes ``ready`` to ``--ready`` and waits for the file
``--go`` to appear, so that every process starts at the same instant; then it prints one
JSON line: ``{"pid": ..., "results": [{"status": 200} | {"error": "..."}]}``.

The client secret comes from ``$OAUTH_APP_CLIENT_SECRET``, the token key from
``$SYNCKIT_SECRET_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config
from synckit.runtime.http.transports import tls_context
from synckit.runtime.observe.logging import configure_logging
from synckit.store.db import open_database


def barrier(ready: Path, go: Path) -> None:
    """Say we are ready, then wait for the signal that every process is."""
    ready.write_text("ready")
    while not go.exists():
        time.sleep(0.002)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    db = open_database(args.database_url)
    cfg = OAuth2Config(args.token_url, args.client_id, os.environ["OAUTH_APP_CLIENT_SECRET"])
    try:
        # Warm the pool so that connecting is not part of the race.
        async with db.begin() as conn:
            await conn.execute(text("SELECT 1"))
        await asyncio.to_thread(barrier, Path(args.ready), Path(args.go))

        async def job() -> dict[str, Any]:
            auth = OAuth2Auth(db, args.tenant, cfg)
            try:
                async with httpx.AsyncClient(auth=auth, timeout=60, verify=tls_context()) as client:
                    response = await client.get(args.resource_url)
                return {"status": response.status_code}
            except Exception as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}

        return list(await asyncio.gather(*(job() for _ in range(args.tasks))))
    finally:
        await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("database-url", "tenant", "token-url", "client-id", "resource-url"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--go", required=True)
    arguments = parser.parse_args()
    configure_logging(json_lines=True)  # logs to stderr; stdout carries the result
    results = asyncio.run(main(arguments))
    print(json.dumps({"pid": os.getpid(), "results": results}), flush=True)

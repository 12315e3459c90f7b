"""Reads take no write lock.

On SQLite every read operation behind `jobs ls|show`, `breakers ls`, `tenants ls|show`,
`status`, a `/metrics` scrape, the worker's key check and an OAuth token load runs in a
deferred transaction (a WAL snapshot): a writer holding the write lock (a worker's batch,
another process's long transaction) never makes them wait out ``busy_timeout`` (30 s).
PostgreSQL readers never wait for writers; the same reads run there beside an open
transaction that has updated the rows they read.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from quiet_app import Quiet  # tests/apps
from sqlalchemy import update
from waits import EVENT_TIMEOUT  # tests/

from synckit import App
from synckit.runtime.admin.bulk import add_tenants
from synckit.runtime.admin.tenant_pages import page_tenants, read_checkpoints, read_tenant
from synckit.runtime.admin.tenants import dead_letter_counts, get_tenant, list_tenants
from synckit.runtime.credentials.keys import find_unopenable
from synckit.runtime.credentials.secrets import TokenCipher
from synckit.runtime.observe.metrics import read_snapshot
from synckit.store import resources as resource_store
from synckit.store.db import Database, open_database
from synckit.store.jobs import admin, enqueueing
from synckit.store.tables import connections, jobs


async def test_every_read_runs_while_another_connection_holds_the_write_lock(db: Database) -> None:
    await add_tenants(db, [{"tenant": "t1", "connector": "quiet"}], app=App([Quiet]))
    job_id = (await enqueueing.enqueue(db, "noop", {}, resource_key="quiet:t1")).id
    resource = (await resource_store.list_resources(db))[0]
    reads: dict[str, Callable[[], Awaitable[Any]]] = {
        "jobs ls": lambda: admin.list_jobs(db),
        "jobs show": lambda: admin.get_job(db, job_id),
        "jobs by status": lambda: admin.count_by_status(db),
        "breakers ls": lambda: resource_store.list_resources(db),
        "one resource": lambda: resource_store.get_resource(db, resource.resource_key),
        "tenants ls (a page)": lambda: page_tenants(db, limit=10),
        "tenants show": lambda: read_tenant(db, "t1"),
        "checkpoints": lambda: read_checkpoints(db, "t1"),
        "get_tenant": lambda: get_tenant(db, "t1", reveal=False),
        "list_tenants": lambda: list_tenants(db, reveal=False),
        "dead-letter counts": lambda: dead_letter_counts(db, "t1"),
        "/metrics": lambda: read_snapshot(db),
        "key check": lambda: find_unopenable(db, TokenCipher.from_env()),
    }
    sqlite = db.engine.dialect.name == "sqlite"
    if sqlite:
        writer = sqlite3.connect(str(db.engine.url.database), isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE jobs SET priority = 7")
        writer.execute("UPDATE connections SET updated_at = updated_at")
    else:
        other = open_database(db.given_url)
        held = other.begin()
        conn = await held.__aenter__()
        await conn.execute(update(jobs).values(priority=7))
        await conn.execute(update(connections).values(updated_at=connections.c.updated_at))
    try:
        slow = []
        for name, read in reads.items():
            try:
                # One that waited for the writer would wait until the finally below.
                await asyncio.wait_for(read(), timeout=EVENT_TIMEOUT)
            except TimeoutError:
                slow.append(name)
        assert not slow, f"waited for the writer: {slow}"
        # What the reads saw is the last committed state, not the writer's.
        assert (await admin.get_job(db, job_id)).priority == 0
    finally:
        if sqlite:
            writer.execute("ROLLBACK")
            writer.close()
        else:
            await held.__aexit__(None, None, None)
            await other.dispose()

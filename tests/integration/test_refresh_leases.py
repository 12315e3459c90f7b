"""The OAuth refresh on the one lease (store/leases.py, on ``connections``' own
``refresh_owner`` / ``refresh_until``): a refresher whose lease ran out and that another
took over cannot store its token set; the new holder's stands. Each step runs in its own
OS process, on both engines; the times are given, not waited for."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select
from waits import PROCESS_TIMEOUT  # tests/

from synckit.store.db import open_database
from synckit.store.tables import connections

STEP = Path(__file__).parents[1] / "apps" / "refresh_lease.py"
T0 = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
LEASE = timedelta(seconds=65)


def step(url: str, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, str(STEP), url, *args],
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # after any log lines


def take(url: str, owner: str, at: datetime) -> bool:
    return bool(step(url, "take", "acme", owner, at.isoformat(), (at + LEASE).isoformat()))


def save(url: str, owner: str, at: datetime) -> bool:
    return bool(step(url, "save", "acme", owner, at.isoformat(), f"set-of-{owner}"))


async def connection(url: str, *, seed: bool = False) -> Any:
    db = open_database(url)
    try:
        async with db.begin() as conn:
            if seed:
                await conn.execute(
                    insert(connections).values(
                        tenant="acme",
                        connector="c",
                        resource_key="c:acme",
                        status="active",
                        created_at=T0,
                        updated_at=T0,
                    )
                )
            return (await conn.execute(select(connections))).one()
    finally:
        await db.dispose()


async def test_a_refresher_whose_lease_ran_out_cannot_store_its_token_set(
    migrated_url: str,
) -> None:
    await connection(migrated_url, seed=True)
    assert take(migrated_url, "worker-a", T0)
    assert not take(migrated_url, "worker-b", T0 + LEASE / 2)  # held: single flight
    later = T0 + LEASE + timedelta(seconds=1)
    assert take(migrated_url, "worker-b", later)  # ran out: taken over
    assert not save(migrated_url, "worker-a", later)  # the late holder stores nothing
    row = await connection(migrated_url)
    assert (row.token_set, row.refresh_owner) == (None, "worker-b")
    assert save(migrated_url, "worker-b", later)
    row = await connection(migrated_url)
    assert bytes(row.token_set) == b"set-of-worker-b"
    assert (row.refresh_owner, row.refresh_until) == (None, None)


async def test_a_refresher_past_its_lease_still_stores_when_nobody_took_over(
    migrated_url: str,
) -> None:
    """The one lease's rule: a lease that ended but that nobody took over still holds."""
    await connection(migrated_url, seed=True)
    assert take(migrated_url, "worker-a", T0)
    assert save(migrated_url, "worker-a", T0 + LEASE * 3)
    row = await connection(migrated_url)
    assert bytes(row.token_set) == b"set-of-worker-a" and row.refresh_owner is None

"""Alert delivery on the one lease (store/leases.py): an evaluator whose delivery lease
ran out, and whose alert another evaluator took over, cannot finish it; the new holder's
outcome stands. Each step runs in its own OS process, on both engines; the times are
given, not waited for."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from waits import PROCESS_TIMEOUT  # tests/

from synckit.store.db import open_database
from synckit.store.tables import alerts

STEP = Path(__file__).parents[1] / "apps" / "alert_lease.py"
T0 = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
LEASE = 60.0


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


async def row(url: str) -> Any:
    db = open_database(url)
    try:
        async with db.begin() as conn:
            return (await conn.execute(select(alerts))).one()
    finally:
        await db.dispose()


async def test_a_holder_whose_lease_ran_out_cannot_finish(migrated_url: str) -> None:
    first = step(migrated_url, "claim", T0.isoformat(), str(LEASE))
    assert len(first["ids"]) == 1
    (record_id,) = first["ids"]
    # While the first lease lasts, nobody else takes the alert.
    during = step(migrated_url, "claim", (T0 + timedelta(seconds=30)).isoformat(), str(LEASE))
    assert during["ids"] == []
    # Once it has ended, another evaluator takes it over under a lease of its own.
    later = T0 + timedelta(seconds=LEASE + 10)
    second = step(migrated_url, "claim", later.isoformat(), str(LEASE))
    assert second["ids"] == [record_id] and second["token"] != first["token"]
    # The first holder comes back: its finish changes nothing.
    late = (later + timedelta(seconds=1)).isoformat()
    assert step(migrated_url, "finish", late, first["token"], str(record_id), "stale") == [
        record_id
    ]
    held = await row(migrated_url)
    assert held.finished_at is None and held.delivered == {}
    assert held.lease_token == second["token"]
    # The new holder's finish stands, and releases the row.
    assert step(migrated_url, "finish", late, second["token"], str(record_id), "fresh") == []
    done = await row(migrated_url)
    assert done.finished_at is not None and set(done.delivered) == {"fresh"}
    assert (done.lease_token, done.lease_expires_at, done.attempts) == (None, None, 1)


async def test_a_holder_past_its_lease_still_finishes_when_nobody_took_over(
    migrated_url: str,
) -> None:
    """A lease that ended but that no other evaluator took over still holds (the one
    lease's rule): the late outcome is the truth and is kept."""
    first = step(migrated_url, "claim", T0.isoformat(), str(LEASE))
    (record_id,) = first["ids"]
    late = (T0 + timedelta(seconds=LEASE * 3)).isoformat()
    assert step(migrated_url, "finish", late, first["token"], str(record_id), "up") == []
    done = await row(migrated_url)
    assert done.finished_at is not None and set(done.delivered) == {"up"}

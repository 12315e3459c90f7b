"""One step of alert delivery in its own OS process, for the fenced-finish tests:

``python alert_lease.py URL claim NOW_ISO LEASE_S`` takes the alert ``k1`` (recording it
if new) and prints ``{"token": ..., "ids": [...]}``; ``python alert_lease.py URL finish
NOW_ISO TOKEN ID SINK`` notes that SINK took alert ID under TOKEN and prints the ids it
could not note (``[]``: noted)."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timedelta

from synckit.store import alerts
from synckit.store.db import open_database

FIRED = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
ROW = alerts.AlertRow("rule", "subject", "w", "warning", "acme", "c", "m", {}, FIRED)


async def main(url: str, step: str, now_iso: str, *rest: str) -> None:
    now = datetime.fromisoformat(now_iso)
    db = open_database(url)
    try:
        async with db.begin() as conn:
            if step == "claim":
                got = await alerts.claim_deliveries(
                    conn, {"k1": ROW}, now=now, lease=timedelta(seconds=float(rest[0]))
                )
                ids = [s.id for s in got.owed] + [i for i, _ in got.new]
                print(json.dumps({"token": got.lease.token, "ids": ids}))
            else:
                token, record_id, sink = rest
                outcome = alerts.DeliveryOutcome(int(record_id), {sink: now_iso}, True)
                lost = await alerts.finish_deliveries(conn, [outcome], now=now, token=token)
                print(json.dumps(lost))
    finally:
        await db.dispose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))

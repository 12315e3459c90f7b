"""The one lease (synckit.store.leases) on both engines: claim, take-over, fencing, and
the migration that moved the old leases into its columns."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text
from waits import PROCESS_TIMEOUT, wait_until  # tests/

from synckit.store import leases, migrate
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.leases import Lease
from synckit.store.tables import dead_letters, intents, outbox

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


async def _message(db: Database, n: int = 1) -> list[int]:
    async with db.begin() as conn:
        res = await conn.execute(
            insert(outbox).returning(outbox.c.id),
            [
                {
                    "topic": "t",
                    "payload": {"i": i},
                    "message_id": f"m{i}",
                    "status": "pending",
                    "next_attempt_at": NOW,
                    "created_at": NOW,
                }
                for i in range(n)
            ],
        )
        return [int(r[0]) for r in res]


async def _claim(db: Database, ids: list[int], lease: Lease, now: datetime) -> list[int]:
    async with db.begin() as conn:
        stmt = leases.claim(outbox, lease, outbox.c.id.in_(ids), now=now).returning(outbox.c.id)
        return sorted(int(r[0]) for r in await conn.execute(stmt))


async def _fenced_write(db: Database, ids: list[int], token: str, error: str) -> list[int]:
    async with db.begin() as conn:
        stmt = leases.fenced(
            outbox, token, outbox.c.id.in_(ids), values={"last_error": error}
        ).returning(outbox.c.id)
        return sorted(int(r[0]) for r in await conn.execute(stmt))


async def test_a_live_lease_keeps_other_claimers_off(db: Database) -> None:
    """A row under an unexpired lease is not claimed again; a free one is."""
    a, b = await _message(db, 2)
    assert await _claim(db, [a], Lease("one", NOW + MINUTE), NOW) == [a]
    assert await _claim(db, [a, b], Lease("two", NOW + MINUTE), NOW + MINUTE / 2) == [b]


async def test_an_expired_lease_is_taken_over_and_the_stale_holder_is_fenced(
    db: Database,
) -> None:
    """Past its expiry a lease is taken over; the old token's write then changes nothing,
    the new holder's write applies and releases the row."""
    (a,) = await _message(db)
    assert await _claim(db, [a], Lease("old", NOW + MINUTE), NOW) == [a]
    assert await _claim(db, [a], Lease("new", NOW + 3 * MINUTE), NOW + MINUTE) == [a]
    assert await _fenced_write(db, [a], "old", "stale") == []
    assert await _fenced_write(db, [a], "new", "fresh") == [a]
    async with db.read() as conn:
        row = (await conn.execute(select(outbox).where(outbox.c.id == a))).one()
    assert (row.last_error, row.lease_token, row.lease_expires_at) == ("fresh", None, None)


async def test_an_expired_lease_nobody_took_still_holds_for_its_holder(db: Database) -> None:
    """A late holder whose lease ended but was not taken over still writes its outcome."""
    (a,) = await _message(db)
    assert await _claim(db, [a], Lease("late", NOW + MINUTE), NOW) == [a]
    assert await _fenced_write(db, [a], "late", "done late") == [a]


# --- several OS processes --------------------------------------------------------------

# Each process claims every dead letter it is given, in its own order, each in its own
# short transaction, from the same instant; it prints the ids it won.
_CLAIMER = textwrap.dedent(
    """
    import asyncio, json, os, random, sys, time
    from datetime import timedelta
    from synckit.clock import utcnow
    from synckit.store.dead_letters import capture as dlq_capture
    from synckit.store.dead_letters import reads as dlq_reads
    from synckit.store.dead_letters import replay as dlq_replay
    from synckit.store.db import open_database
    from synckit.store.leases import new_lease

    async def main(url, ids, start):
        db = open_database(url)
        won = []
        random.shuffle(ids)
        try:
            open(f"{start}.{os.getpid()}", "w").close()  # ready: imported and connected
            while not os.path.exists(start):
                await asyncio.sleep(0.001)
            for i in ids:
                async with db.begin() as conn:
                    lease = new_lease(timedelta(minutes=5))
                    got = await dlq_replay.claim_ids(conn, [i], now=utcnow(), lease=lease)
                if got:
                    won.append(i)
                    async with db.begin() as conn:
                        ok = await dlq_replay.mark_resolved(
                            conn, [i], now=utcnow(), reason="replayed", token=lease.token
                        )
                    assert ok == [i], ok
        finally:
            await db.dispose()
        print(json.dumps(won))

    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]))
    """
)


async def test_processes_replaying_the_same_dead_letters_win_each_once(
    db: Database, migrated_url: str
) -> None:
    """Four processes claim the same 30 dead letters at once: each row is won by exactly
    one of them, whose fenced outcome applies."""
    ids: list[int] = []
    for i in range(30):
        async with db.begin() as conn:
            c = await dlq_capture.capture(
                conn,
                tenant="acme",
                connector="mail",
                kind="record:messages",
                record_id=f"r{i}",
                payload={"id": i},
                error_class="transient",
                message="boom",
                now=NOW,
            )
        ids.append(c.id)
    won = await asyncio.to_thread(_claimers, migrated_url, ids, 4)
    assert sorted(won) == sorted(ids)
    rows = [await dlq_reads.get(db, i) for i in ids]
    assert all(r.status == "resolved" and r.lease_token is None for r in rows)


def _claimers(url: str, ids: list[int], n: int) -> list[int]:
    lines = _run_all([_CLAIMER, url, json.dumps(ids)], n)
    return [i for line in lines for i in json.loads(line)]


# Each process runs the same intent at once; its create appends a line to a file, slowly.
_INTENT_RUNNER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from synckit.runtime.writes.intents import RemoteRecord, run_intent
    from synckit.store.db import open_database

    async def main(url, path, start):
        db = open_database(url)

        async def create(idem):
            with open(path, "a") as f:
                f.write(idem + "\\n")
            await asyncio.sleep(0.5)
            return RemoteRecord("remote-1")

        try:
            open(f"{start}.{os.getpid()}", "w").close()  # ready: imported and connected
            while not os.path.exists(start):
                await asyncio.sleep(0.001)
            result = await run_intent(
                db, tenant="acme", connector="demo", key="k", create=create, request={"a": 1}
            )
        finally:
            await db.dispose()
        print(result.outcome, result.remote_id)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


async def test_processes_running_one_intent_create_it_once(
    db: Database, migrated_url: str, tmp_path: Any
) -> None:
    """Four processes run one intent at once: one creates (under the lease), the others
    wait for it and get the stored result."""
    calls = tmp_path / "creates.txt"
    outs = await asyncio.to_thread(_run_all, [_INTENT_RUNNER, migrated_url, str(calls)], 4)
    outcomes = sorted(line.split()[0] for line in outs)
    assert outcomes == ["created", "stored", "stored", "stored"]
    assert len(calls.read_text().splitlines()) == 1
    async with db.read() as conn:
        row = (await conn.execute(select(intents))).one()
    assert (row.status, row.remote_id, row.attempts, row.lease_token) == (
        "done",
        "remote-1",
        1,
        None,
    )


def _run_all(args: list[str], n: int) -> list[str]:
    """Run ``python -c *args <go>`` in ``n`` processes, which start together once every
    one is ready (each touches ``<go>.<pid>``, then waits for ``<go>``); their last
    stdout lines."""
    go = Path(tempfile.mkdtemp()) / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", *args, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(n)
    ]
    wait_until(
        lambda: (
            all(go.with_name(f"go.{p.pid}").exists() for p in procs)
            or any(p.poll() is not None for p in procs)
        ),
        "the processes ready",
        interval=0.02,
    )
    go.touch()
    lines = []
    for p in procs:
        out, err = p.communicate(timeout=PROCESS_TIMEOUT)
        assert p.returncode == 0, err.decode()[-2000:]
        lines.append(out.decode().strip().splitlines()[-1])
    return lines


# --- the migration ------------------------------------------------------------------------


async def test_the_migration_moves_in_flight_leases_into_the_columns(db_url: str) -> None:
    """0011: a DLQ row held as ``replaying:<token>`` and an intent held through
    ``result._lease`` keep their holder and expiry in the lease columns; an unreadable
    ``_lease`` is dropped (expired); downgrading writes them back."""
    until = NOW + 5 * MINUTE
    d = open_database(db_url)
    try:
        await migrate.upgrade(d, "0010")
        base: dict[str, Any] = {
            "tenant": "acme",
            "connector": "mail",
            "kind": "record:messages",
            "payload": {},
            "error_class": "transient",
            "error_message": "x",
            "status": "pending",
            "first_failed_at": NOW,
            "last_attempt_at": NOW,
        }
        intent: dict[str, Any] = {
            "tenant": "acme",
            "connector": "mail",
            "status": "pending",
            "fingerprint": "f",
            "attempts": 1,
            "created_at": NOW,
            "updated_at": NOW,
        }
        async with d.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO dead_letters (tenant, connector, kind, record_id, payload,"
                    " error_class, error_message, status, status_reason, first_failed_at,"
                    " last_attempt_at, next_retry_at, attempt_count, replay_attempts)"
                    " VALUES (:tenant, :connector, :kind, :record_id, NULL, :error_class,"
                    " :error_message, :status, :reason, :first, :first, :next, 1, 0)"
                ).bindparams(_ts("first", NOW), _ts("next", until)),
                [
                    {**_text(base), "record_id": "held", "reason": "replaying:abc123"},
                    {**_text(base), "record_id": "free", "reason": "waiting: breaker open"},
                ],
            )
            await conn.execute(
                text(
                    "INSERT INTO intents (tenant, connector, intent_key, status, fingerprint,"
                    " attempts, result, created_at, updated_at) VALUES (:tenant, :connector,"
                    " :key, :status, :fingerprint, :attempts, :result, :first, :first)"
                ).bindparams(_ts("first", NOW)),
                [
                    {
                        **_text(intent),
                        "key": "held",
                        "result": json.dumps(
                            {
                                "_last_error": "boom",
                                "_lease": {"owner": "host:1:ab", "until": until.isoformat()},
                            }
                        ),
                    },
                    {
                        **_text(intent),
                        "key": "garbled",
                        "result": json.dumps({"_lease": {"owner": "x", "until": "soon"}}),
                    },
                ],
            )
        await migrate.upgrade(d)
        async with d.read() as conn:
            dl = {
                r.record_id: r
                for r in await conn.execute(
                    select(
                        dead_letters.c.id,
                        dead_letters.c.record_id,
                        dead_letters.c.status_reason,
                        dead_letters.c.lease_token,
                        dead_letters.c.lease_expires_at,
                    )
                )
            }
            it = {r.intent_key: r for r in await conn.execute(select(intents))}
        assert (dl["held"].lease_token, dl["held"].lease_expires_at) == ("abc123", until)
        assert dl["held"].status_reason is None
        assert (dl["free"].lease_token, dl["free"].status_reason) == (None, "waiting: breaker open")
        held = it["held"]
        assert (held.lease_token, held.lease_expires_at) == ("host:1:ab", until)
        assert held.result == {"_last_error": "boom"}
        garbled = it["garbled"]
        assert (garbled.lease_token, garbled.lease_expires_at, garbled.result) == (None, None, {})
        # The new code sees the row as held by the migrated lease.
        async with d.begin() as conn:
            assert await dlq_replay.mark_resolved(conn, [dl["held"].id], now=NOW, token="x") == []
        await migrate.downgrade(d, "0010")
        async with d.read() as conn:
            back = dict(
                (
                    await conn.execute(text("SELECT record_id, status_reason FROM dead_letters"))
                ).all()
            )
            result = (
                await conn.execute(text("SELECT result FROM intents WHERE intent_key = 'held'"))
            ).scalar_one()
        assert back == {"held": "replaying:abc123", "free": "waiting: breaker open"}
        lease = (json.loads(result) if isinstance(result, str) else result)["_lease"]
        assert lease["owner"] == "host:1:ab"
        assert datetime.fromisoformat(lease["until"]) == until
    finally:
        await d.dispose()


def _ts(name: str, value: datetime) -> Any:
    from sqlalchemy import bindparam

    from synckit.store.tables import UTCDateTime

    return bindparam(name, value=value, type_=UTCDateTime())


def _text(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not isinstance(v, datetime | dict)}

"""`synckit outbox ls` and `synckit outbox retry`, in process (tests/inprocess.py), on
both engines."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from engines import sqlite_only  # tests/
from inprocess import run_cli  # tests/

from synckit.errors.exceptions import PublishRejected
from synckit.runtime.writes import outbox
from synckit.runtime.writes.outbox import CallbackPublisher
from synckit.store.db import open_database
from synckit.store.outbox import NewMessage, OutboxMessage

SYNCKIT = [sys.executable, "-m", "synckit.cli"]


def synckit(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"COLUMNS": "200"})  # in process (tests/inprocess.py)


def seed(url: str) -> None:
    """Five messages: three published, two refused by the broker (failed, dead-lettered)."""

    async def reject_invoices(m: OutboxMessage) -> None:
        if m.topic == "invoices.created":
            raise PublishRejected("unroutable: NO_ROUTE")

    async def go() -> None:
        db = open_database(url)
        try:
            async with db.begin() as conn:
                await outbox.add_many(
                    conn,
                    [
                        NewMessage("orders.created", {"n": 1}, key="o-1", message_id="ord-1"),
                        NewMessage("orders.created", {"n": 2}, key="o-2", message_id="ord-2"),
                        NewMessage("orders.paid", {"n": 3}, key="o-1", message_id="ord-3"),
                        NewMessage("invoices.created", {"n": 4}, message_id="inv-1"),
                        NewMessage("invoices.created", {"n": 5}, message_id="inv-2"),
                    ],
                )
            await outbox.OutboxRelay(db, CallbackPublisher(reject_invoices)).run_until_empty()
        finally:
            await db.dispose()

    asyncio.run(go())


def ls_json(url: str, *args: str) -> list[dict[str, Any]]:
    result = synckit("outbox", "ls", "--json", "--database-url", url, *args)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def test_ls_lists_and_filters_messages(migrated_url: str) -> None:
    """ls shows messages newest first, filtered by status, topic and limit, as JSON or a table."""
    seed(migrated_url)
    everything = ls_json(migrated_url)
    assert [r["message_id"] for r in everything] == ["inv-2", "inv-1", "ord-3", "ord-2", "ord-1"]
    assert everything[-1]["payload"] == {"n": 1} and everything[-1]["key"] == "o-1"
    failed = ls_json(migrated_url, "--status", "failed")
    assert {r["message_id"] for r in failed} == {"inv-1", "inv-2"}
    assert all(r["last_error"] == "unroutable: NO_ROUTE" for r in failed)
    assert [r["message_id"] for r in ls_json(migrated_url, "--topic", "orders.paid")] == ["ord-3"]
    assert len(ls_json(migrated_url, "--limit", "2")) == 2

    table = synckit("outbox", "ls", "--database-url", migrated_url, "--status", "published")
    assert table.returncode == 0, table.stderr
    assert "orders.created" in table.stdout and "invoices.created" not in table.stdout
    assert "pending 0, published 3, failed 2" in table.stdout


@sqlite_only
def test_retry_puts_failed_messages_back_to_pending(migrated_url: str) -> None:
    """retry ID re-queues one failed message; retry --failed re-queues all the rest."""
    seed(migrated_url)
    ids = {r["message_id"]: r["id"] for r in ls_json(migrated_url)}
    one = synckit("outbox", "retry", str(ids["inv-1"]), "--database-url", migrated_url)
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == "1 message back to pending"
    pending = ls_json(migrated_url, "--status", "pending")
    assert [r["message_id"] for r in pending] == ["inv-1"]
    assert pending[0]["attempts"] == 0

    rest = synckit("outbox", "retry", "--failed", "--database-url", migrated_url)
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.strip() == "1 message back to pending"
    assert ls_json(migrated_url, "--status", "failed") == []
    assert len(ls_json(migrated_url, "--status", "pending")) == 2


def test_retry_errors_are_one_line(migrated_url: str) -> None:
    """Unknown ids, published messages and bad arguments: one line on stderr, exit 2."""
    seed(migrated_url)
    ids = {r["message_id"]: r["id"] for r in ls_json(migrated_url)}
    cases = [
        (["retry", "424242"], "no outbox message with id 424242"),
        (["retry", str(ids["ord-1"])], "already published"),
        (["retry"], "give message ids or --failed"),
        (["retry", "--topic", "x", str(ids["inv-1"])], "--topic goes with --failed"),
    ]
    for args, message in cases:
        result = synckit("outbox", *args, "--database-url", migrated_url)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert message in lines[0]
    # Nothing changed: the refused retries were all-or-nothing.
    assert len(ls_json(migrated_url, "--status", "failed")) == 2

"""``synckit outbox ...``: look at the outbox and put failed messages back in line."""

from __future__ import annotations

import json
from datetime import datetime

import click
from rich.table import Table

from synckit.cli.options import (
    ROW_ID,
    ROWS_SHOWN,
    CliError,
    cell,
    console,
    database_option,
    print_unreadable,
    run,
)
from synckit.redaction import redact
from synckit.runtime.writes import outbox as store
from synckit.store.db import Database

STATUSES = ("pending", "published", "failed")


def _ts(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


@click.group()
def outbox() -> None:
    """Inspect the transactional outbox and retry failed messages."""


@outbox.command("ls")
@click.option("--status", type=click.Choice(STATUSES), help="Only messages in this status.")
@click.option("--topic", help="Only messages of this topic.")
@click.option("--key", help="Only messages with this ordering key.")
@click.option("--limit", type=ROWS_SHOWN, default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array (payloads included).")
@database_option
def ls(
    status: str | None,
    topic: str | None,
    key: str | None,
    limit: int,
    as_json: bool,
    database_url: str | None,
) -> None:
    """List outbox messages, newest first."""

    async def go(d: Database) -> tuple[list[store.OutboxInfo], dict[str, int]]:
        rows = await store.list_messages(d, status=status, topic=topic, key=key, limit=limit)
        return rows, await store.count_by_status(d)

    rows, counts = run(go, database_url)
    if as_json:
        click.echo(json.dumps(redact([r.to_json() for r in rows]), indent=2))
        return
    table = Table(title="Outbox")
    for col in ("id", "status", "topic", "key", "message id", "tries", "when", "last error"):
        table.add_column(col, justify="right" if col in ("id", "tries") else "left")
    for r in rows:
        # Pending: when it is next tried; published: when; failed: when it was written.
        name = {"pending": "next_attempt_at", "published": "published_at"}.get(r.status)
        if name is None or (getattr(r, name) is None and name not in r.unreadable):
            name = "created_at"
        when = "<unreadable>" if name in r.unreadable else _ts(getattr(r, name))
        table.add_row(
            str(r.id),
            cell(r.status),
            cell(r.topic),
            cell(r.key),
            cell(r.message_id),
            str(r.attempts),
            cell(when),
            cell(r.last_error, 50),
        )
    table.caption = ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES)
    if not rows:
        table.caption = "no messages match; " + table.caption
    console.print(table)
    print_unreadable(console, rows, "message")


@outbox.command("retry")
@click.argument("ids", nargs=-1, type=ROW_ID)
@click.option("--failed", "all_failed", is_flag=True, help="Retry every failed message.")
@click.option("--topic", help="With --failed: only failed messages of this topic.")
@database_option
def retry(
    ids: tuple[int, ...], all_failed: bool, topic: str | None, database_url: str | None
) -> None:
    """Put messages back to pending, due now: the IDS given, or --failed for all failed."""
    if bool(ids) == all_failed:
        raise CliError("give message ids or --failed (not both)")
    if topic and not all_failed:
        raise CliError("--topic goes with --failed")

    async def go(d: Database) -> int:
        if all_failed:
            return await store.retry_failed(d, topic=topic)
        return await store.retry_messages(d, ids)

    n = run(go, database_url)
    click.echo(f"{n} message{'s' if n != 1 else ''} back to pending")

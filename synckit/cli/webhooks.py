"""``synckit webhooks ...``: the webhook inbox, counted per tenant, one event shown,
and an event put back to be processed again.

Heavy imports (rich, SQLAlchemy through the store) sit inside the commands, so that
``synckit --help`` does not pay for them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from synckit.cli.options import ROW_ID, CliError, cell, console, database_option, run

if TYPE_CHECKING:
    from synckit.store.db import Database

#: A stored body is shown up to this many characters (it is the provider's, untrusted).
BODY_SHOWN = 4000
COLUMNS = ("received", "duplicates", "refused", "orphaned", "pending", "processed", "failed")


def _ts(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


@click.group()
def webhooks() -> None:
    """Inspect the webhook inbox: what was received, refused, orphaned, processed."""


@webhooks.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@database_option
def ls(as_json: bool, database_url: str | None) -> None:
    """Count deliveries per connector and tenant ('-': refused or orphaned ones that named
    no known tenant)."""
    from synckit.store import webhooks as inbox

    async def go(d: Database) -> list[inbox.WebhookCounts]:
        return await d.run_read(inbox.webhook_counts)

    rows = run(go, database_url)
    if as_json:
        out = [
            {"connector": r.connector, "tenant": r.tenant or None}
            | {c: getattr(r, c) for c in COLUMNS}
            for r in rows
        ]
        click.echo(json.dumps(out, indent=2))
        return
    from rich.table import Table

    table = Table(title="Webhooks")
    table.add_column("connector")
    table.add_column("tenant")
    for c in COLUMNS:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(
            cell(r.connector), cell(r.tenant or "-"), *(str(getattr(r, c)) for c in COLUMNS)
        )
    if not rows:
        table.caption = "no deliveries yet"
    console.print(table)


def _shown(r: Any) -> dict[str, Any]:
    body = bytes(r.body)
    text = body.decode("utf-8", "replace")
    return {
        "id": r.id,
        "connector": r.connector,
        "tenant": r.tenant or None,
        "event_id": r.event_id,
        "status": r.status,
        "named_tenant": r.claimed,
        "duplicates": r.duplicates,
        "attempts": r.attempts,
        "last_error": r.last_error,
        "received_at": _ts(r.received_at),
        "processed_at": _ts(r.processed_at),
        "headers": dict(r.headers or {}),
        "body_bytes": len(body),
        "body": text[:BODY_SHOWN],
    }


@webhooks.command("show")
@click.argument("event", type=ROW_ID)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@database_option
def show(event: int, as_json: bool, database_url: str | None) -> None:
    """Show one stored event (its id in the inbox): where it stands, headers and body."""
    from synckit.store import webhooks as inbox

    async def go(d: Database) -> Any:
        return await d.run_read(inbox.event_row, event)

    row = run(go, database_url)
    if row is None:
        raise CliError(f"no webhook event {event}")
    shown = _shown(row)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    for key, value in shown.items():
        if key in ("headers", "body"):
            continue
        console.print(f"{key}: ", cell("-" if value is None else value), sep="")
    for name, value in shown["headers"].items():
        console.print(f"header {name}: ", cell(value), sep="")
    console.print("body:")
    console.print(cell(shown["body"]))
    if shown["body_bytes"] > BODY_SHOWN:
        console.print(f"... ({shown['body_bytes']} bytes in all)")


@webhooks.command("replay")
@click.argument("event", type=ROW_ID)
@database_option
def replay(event: int, database_url: str | None) -> None:
    """Put a stored event back to pending: the next worker processes it again."""
    from synckit.clock import utcnow
    from synckit.runtime.sync.webhooks import process_job_spec
    from synckit.store import webhooks as inbox

    async def go(d: Database) -> bool:
        row = await d.run_read(inbox.event_row, event)
        if row is None:
            raise CliError(f"no webhook event {event}")
        job = process_job_spec(row.connector, row.tenant)
        now = utcnow()
        return await d.write(lambda c: inbox.requeue(c, event, job, now))

    if not run(go, database_url):
        raise CliError(f"webhook event {event} names no tenant (an orphan): nothing to replay")
    click.echo(f"webhook event {event} back to pending")

"""`synckit workers ls`: the worker processes, alive, stopped or lost (silent for three of
their heartbeat periods)."""

from __future__ import annotations

import json

import click
from rich.table import Table

from synckit.cli.options import cell, console, database_option, run
from synckit.clock import utcnow
from synckit.store.db import Database
from synckit.store.workers import WorkerRow, list_workers


@click.group("workers")
def workers() -> None:
    """Worker processes: who runs jobs, where, and whether they are still alive."""


@workers.command("ls")
@click.option("--json", "as_json", is_flag=True)
@database_option
def workers_ls(as_json: bool, database_url: str | None) -> None:
    """List the workers seen in the last day, the most recently seen first."""
    now = utcnow()

    async def read(d: Database) -> list[WorkerRow]:
        return await list_workers(d, now=now)

    found = run(read, database_url)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "worker_id": w.worker_id,
                        "state": w.state,
                        "host": w.host,
                        "pid": w.pid,
                        "version": w.version,
                        "concurrency": w.concurrency,
                        "in_flight": w.in_flight,
                        "started_at": w.started_at.isoformat(),
                        "last_seen_at": w.last_seen_at.isoformat(),
                        "stopped_at": w.stopped_at.isoformat() if w.stopped_at else None,
                        "lost_after_seconds": w.lost_after.total_seconds(),
                    }
                    for w in found
                ],
                indent=2,
            )
        )
        return
    alive = sum(1 for w in found if w.state == "alive")
    table = Table(title=f"Workers ({alive} alive)")
    for col in ("worker", "state", "host", "pid", "version", "concurrency", "in flight"):
        table.add_column(col)
    table.add_column("started")
    table.add_column("last seen")
    for w in found:
        seen = int((now - w.last_seen_at).total_seconds())
        table.add_row(
            cell(w.worker_id),
            w.state,
            cell(w.host),
            str(w.pid),
            cell(w.version),
            str(w.concurrency),
            str(w.in_flight),
            w.started_at.isoformat(timespec="seconds"),
            f"{w.last_seen_at.isoformat(timespec='seconds')} ({seen}s ago)",
        )
    if not found:
        table.caption = "no worker seen in the last day"
    console.print(table)

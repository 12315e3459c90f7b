"""`synckit breakers ls|reset`: the circuit breakers and pacing all workers share."""

from __future__ import annotations

import json
from datetime import datetime

import click
from rich.table import Table

from synckit.cli.options import CliError, cell, console, database_option, run
from synckit.redaction import redact
from synckit.store.resources import ResourceInfo, list_resources, reset_resource


def _when(r: ResourceInfo, name: str) -> str:
    if name in dict(r.unreadable):
        return "<unreadable>"
    value = getattr(r, name)
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else "-"


def _state(r: ResourceInfo) -> str:
    return f"{r.state} (unknown)" if "state" in dict(r.unreadable) else r.state


@click.group("breakers")
def breakers() -> None:
    """Circuit breakers and pacing per resource (tenant connection or whole API)."""


@breakers.command("ls")
@click.option("--open", "only_open", is_flag=True, help="Only breakers that are not closed.")
@click.option("--json", "as_json", is_flag=True)
@database_option
def breakers_ls(only_open: bool, as_json: bool, database_url: str | None) -> None:
    """List resources with their breaker state, failures and next available time."""
    found = run(list_resources, database_url)
    if only_open:
        found = [r for r in found if r.state != "closed"]
    if as_json:
        for r in found:
            click.echo(json.dumps(_json(r), sort_keys=True))
        return
    table = Table(title=f"Breakers ({len(found)})")
    for col in (
        "resource",
        "parent",
        "state",
        "failures",
        "cool-down until",
        "next available",
        "in flight max",
        "last error",
    ):
        table.add_column(col)
    for r in found:
        table.add_row(
            cell(r.resource_key),
            cell(r.parent_key),
            cell(_state(r)),
            cell(r.consecutive_failures),
            cell(_when(r, "cooldown_until")),
            cell(_when(r, "next_available_at")),
            cell(r.max_in_flight),
            cell(r.last_error, 50),
        )
    console.print(table)


@breakers.command("reset")
@click.argument("resource_key")
@database_option
def breakers_reset(resource_key: str, database_url: str | None) -> None:
    """Close RESOURCE_KEY's breaker and clear its pacing, so its jobs run again."""
    try:
        info = run(lambda db: reset_resource(db, resource_key), database_url)
    except LookupError as exc:
        raise CliError(f"{exc}; see `synckit breakers ls`") from exc
    click.echo(f"{info.resource_key}: breaker {info.state}, pacing cleared")


def _json(r: ResourceInfo) -> dict[str, object]:
    data: dict[str, object] = {}
    for k, v in vars(r).items():
        data[k] = v.isoformat() if isinstance(v, datetime) else v
    # What a corrupt row holds instead of a value, by column (absent when all read).
    data["unreadable"] = dict(r.unreadable)
    if not r.unreadable:
        del data["unreadable"]
    # last_error quotes what an API answered: printed through the redaction step.
    out: dict[str, object] = redact(data)
    return out

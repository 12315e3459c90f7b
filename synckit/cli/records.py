"""``synckit records ls|show|changes``: read the rows a stream's records landed in.

``changes`` is the app's change feed from the command line: the changes after
``--since CURSOR`` (added, updated, deleted), oldest first, and the cursor to read the
next page from (``--json`` prints it with them).
"""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import click

from synckit.cli.options import CliError, console, database_option, run
from synckit.store.db import Database

__all__ = ["records_group"]

_APP = click.option(
    "--app",
    "app_spec",
    envvar="SYNCKIT_APP",
    default=None,
    help="module:attribute of your synckit App (or $SYNCKIT_APP).",
)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _line(row: dict[str, Any]) -> str:
    return json.dumps({k: _plain(v) for k, v in row.items()}, ensure_ascii=False)


def _reader(app_spec: str | None, tenant: str, stream: str, db: Database) -> Any:
    # The App (and so the runtime) is loaded only by the command that runs.
    from synckit.cli.app_loader import load_app

    return load_app(app_spec).records(tenant, stream, db=db)


@click.group("records")
def records_group() -> None:
    """Read the rows a stream's declared records landed in, and their changes."""


@records_group.command("ls")
@click.argument("tenant")
@click.argument("stream")
@click.option("--deleted", is_flag=True, help="Include soft-deleted rows.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@_APP
@database_option
def records_ls(
    tenant: str,
    stream: str,
    deleted: bool,
    limit: int,
    as_json: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """List TENANT's rows of STREAM, in key order."""

    async def go(d: Database) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await _reader(app_spec, tenant, stream, d).rows(
            deleted=deleted, limit=limit
        )
        return rows

    rows = run(go, database_url)
    if as_json:
        for r in rows:
            click.echo(_line(r))
        return
    from rich.table import Table

    table = Table(title=f"{tenant} / {stream}")
    names = list(rows[0]) if rows else []
    for n in names:
        table.add_column(n)
    for r in rows:
        table.add_row(*(str(_plain(r[n]))[:60] for n in names))
    if not rows:
        table.caption = "no rows"
    console.print(table)


@records_group.command("show")
@click.argument("tenant")
@click.argument("stream")
@click.argument("key", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the row as JSON.")
@_APP
@database_option
def records_show(
    tenant: str,
    stream: str,
    key: tuple[str, ...],
    as_json: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """Show TENANT's row of STREAM with KEY (deleted or not)."""

    async def go(d: Database) -> dict[str, Any] | None:
        reader = _reader(app_spec, tenant, stream, d)
        spec = reader.decl.spec
        if len(key) != len(spec.key):
            raise CliError(
                f"the key of {spec.table} is {', '.join(spec.key)}: give {len(spec.key)}"
            )
        values: list[Any] = []
        for name, given in zip(spec.key, key, strict=True):
            if spec.column(name).kind == "int":
                try:
                    values.append(int(given))
                except ValueError:
                    raise CliError(f"key {name}: {given!r} is not an integer") from None
            else:
                values.append(given)
        row: dict[str, Any] | None = await reader.get(*values)
        return row

    row = run(go, database_url)
    if row is None:
        raise CliError(f"no row {' '.join(key)!r} of {tenant}/{stream}")
    if as_json:
        click.echo(_line(row))
        return
    for k, v in row.items():
        click.echo(f"{k}: {_plain(v)}")


@records_group.command("changes")
@click.argument("tenant")
@click.argument("stream")
@click.option(
    "--since", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, help="Cursor."
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print {changes, cursor, more} as JSON.")
@_APP
@database_option
def records_changes(
    tenant: str,
    stream: str,
    since: int,
    limit: int,
    as_json: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """The changes of TENANT's STREAM after cursor --since, oldest first."""

    async def go(d: Database) -> Any:
        return await _reader(app_spec, tenant, stream, d).changes(since=since, limit=limit)

    page = run(go, database_url)
    if as_json:
        out = {
            "changes": [
                {
                    "op": c.op,
                    "key": list(c.key),
                    "seq": c.seq,
                    "synced_at": c.synced_at.isoformat(),
                    "data": {k: _plain(v) for k, v in c.data.items()},
                }
                for c in page.changes
            ],
            "cursor": page.cursor,
            "more": page.more,
        }
        click.echo(json.dumps(out, ensure_ascii=False))
        return
    for c in page.changes:
        click.echo(f"{c.seq}\t{c.op}\t{' '.join(str(k) for k in c.key)}")
    click.echo(f"cursor {page.cursor}" + (" (more)" if page.more else ""))

"""``synckit tenants import FILE``: add many tenants from JSON lines or CSV.

:mod:`synckit.cli.tenants` adds it to the ``tenants`` group.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from synckit.cli.app_loader import app_option, load_app
from synckit.cli.options import CliError, database_option, run
from synckit.connectors.schedule import DEFAULT_SCHEDULE
from synckit.runtime.admin.bulk import add_tenants, read_rows
from synckit.store.db import Database

#: Errors printed one per line; the rest are counted.
_SHOWN_ERRORS = 50


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--connector", help="Connector of rows that name none.")
@click.option("--schedule", default=DEFAULT_SCHEDULE, show_default=True, help="Default schedule.")
@click.option(
    "--skip-invalid",
    is_flag=True,
    help="Add the valid rows even if some are not (default: add nothing then).",
)
@app_option
@database_option
def import_command(
    file: str,
    connector: str | None,
    schedule: str,
    skip_invalid: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """Add the tenants of FILE: JSON lines, or CSV when it ends in .csv.

    Each row has tenant, connector, config (a JSON object; in CSV also config.FIELD
    columns), schedule, resource_key, parent_key. Every row is validated as by
    `tenants add`; errors name the line. Progress goes to stderr.
    """
    app = load_app(app_spec)
    started = time.monotonic()
    shown = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - shown[0] >= 1.0:
            shown[0] = now
            click.echo(f"  {done}/{total} tenants written", err=True)

    async def go(d: Database) -> Any:
        return await add_tenants(
            d,
            read_rows(file),
            app=app,
            connector=connector,
            schedule=schedule,
            skip_invalid=skip_invalid,
            progress=progress,
        )

    result = run(go, database_url)
    for e in result.errors[:_SHOWN_ERRORS]:
        click.echo(f"{file}:{e}", err=True)
    if len(result.errors) > _SHOWN_ERRORS:
        click.echo(f"... and {len(result.errors) - _SHOWN_ERRORS} more errors", err=True)
    took = time.monotonic() - started
    if result.errors and not skip_invalid:
        raise CliError(
            f"{len(result.errors)} invalid row(s) in {file}: nothing added "
            "(fix them, or add the valid rows with --skip-invalid)"
        )
    click.echo(
        f"added {result.added} tenants from {file} in {took:.1f}s"
        + (f", {len(result.errors)} row(s) skipped" if result.errors else "")
    )
    if result.errors:
        sys.exit(1)

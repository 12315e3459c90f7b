"""The ``synckit`` command.

The CLI is a thin shell over the async core: each command builds its arguments, then
enters the core through :func:`run` (one ``asyncio.run``). Every :class:`SynckitError`
becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from synckit.errors.exceptions import SynckitError
from synckit.runtime import migrate
from synckit.runtime.db import ENV_URL, Database, database_url_from_env, mask_url, open_database
from synckit.runtime.status import read_status

T = TypeVar("T")

console = Console()
err_console = Console(stderr=True)


class CliError(click.ClickException):
    """A one-line error, printed as ``error: ...`` with exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def run(make: Callable[[Database], Awaitable[T]], url: str | None, *, check: bool = True) -> T:
    """Open the database, run ``make(db)`` in the async core, and dispose of the engine."""

    async def main() -> T:
        db = open_database(url)
        try:
            if check:
                await db.check()
            return await make(db)
        finally:
            await db.dispose()

    try:
        return asyncio.run(main())
    except SynckitError as exc:
        raise CliError(str(exc)) from exc


database_option = click.option(
    "--database-url",
    "database_url",
    envvar=ENV_URL,
    default=None,
    help=f"Database URL (default: ${ENV_URL}, else sqlite:///synckit.db).",
)


@click.group()
@click.version_option(package_name="synckit")
def cli() -> None:
    """synckit: third-party API sync that survives crashes and hostile APIs."""


@cli.group()
def db() -> None:
    """Create and migrate the synckit schema."""


@db.command("upgrade")
@click.argument("revision", default="head")
@database_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Migrate the schema up to REVISION (default: head)."""

    async def go(d: Database) -> str | None:
        await migrate.upgrade(d, revision)
        return await migrate.current(d)

    rev = run(go, database_url)
    click.echo(f"{mask_url(database_url_from_env(database_url))} at revision {rev}")


@db.command("downgrade")
@click.argument("revision")
@database_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Migrate the schema down to REVISION (`base` removes every table)."""

    async def go(d: Database) -> str | None:
        await migrate.downgrade(d, revision)
        return await migrate.current(d)

    rev = run(go, database_url)
    click.echo(f"{mask_url(database_url_from_env(database_url))} at revision {rev or 'base'}")


@db.command("current")
@database_option
def db_current(database_url: str | None) -> None:
    """Print the schema revision the database is at."""
    rev = run(migrate.current, database_url)
    head = migrate.head_revision()
    state = "up to date" if rev == head else f"head is {head}"
    click.echo(f"{rev or 'base'} ({state})")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@database_option
def status_cmd(as_json: bool, database_url: str | None) -> None:
    """Show tenants, queue depth, dead letters and the outbox at a glance."""
    snapshot = run(read_status, database_url)
    if as_json:
        click.echo(json.dumps(snapshot.to_json(), indent=2, sort_keys=True))
        return
    console.print(f"[bold]synckit[/bold] {snapshot.database}")
    tenants = Table(title="Tenants")
    for col in ("tenant", "connector", "status", "breaker", "next available", "DLQ"):
        tenants.add_column(col)
    for t in snapshot.tenants:
        nxt = t.next_available_at.isoformat(timespec="seconds") if t.next_available_at else "-"
        tenants.add_row(t.tenant, t.connector, t.status, t.breaker, nxt, str(t.dlq_pending))
    if not snapshot.tenants:
        tenants.caption = "no tenants yet"
    console.print(tenants)
    queue = Table(title="Queue")
    statuses = ("pending", "running", "succeeded", "dead", "cancelled", "discarded")
    queue.add_column("kind")
    for s in statuses:
        queue.add_column(s, justify="right")
    for kind, counts in sorted(snapshot.queue.items()):
        queue.add_row(kind, *(str(counts.get(s, 0)) for s in statuses))
    if not snapshot.queue:
        queue.caption = "no jobs yet"
    console.print(queue)
    dlq = ", ".join(f"{k} {v}" for k, v in sorted(snapshot.dead_letters.items())) or "empty"
    console.print(f"Dead letters: {dlq}    Outbox pending: {snapshot.outbox_pending}")


def main() -> None:
    """Entry point of the ``synckit`` console script."""
    try:
        cli.main(prog_name="synckit", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()

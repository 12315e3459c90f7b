"""``synckit db upgrade|downgrade|current``: create and migrate the schema."""

from __future__ import annotations

import click

from synckit.cli.options import database_option, run
from synckit.store import migrate
from synckit.store.db import Database, database_url_from_env, mask_url

__all__ = ["db"]


@click.group("db")
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

    rev = run(go, database_url, schema=False)
    click.echo(f"{mask_url(database_url_from_env(database_url))} at revision {rev}")


@db.command("downgrade")
@click.argument("revision")
@database_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Migrate the schema down to REVISION (`base` removes every table)."""

    async def go(d: Database) -> str | None:
        await migrate.downgrade(d, revision)
        return await migrate.current(d)

    rev = run(go, database_url, schema=False)
    click.echo(f"{mask_url(database_url_from_env(database_url))} at revision {rev or 'base'}")


@db.command("current")
@database_option
def db_current(database_url: str | None) -> None:
    """Print the schema revision the database is at."""
    rev = run(migrate.current, database_url, schema=False)
    head = migrate.head_revision()
    state = "up to date" if rev == head else f"head is {head}"
    click.echo(f"{rev or 'base'} ({state})")

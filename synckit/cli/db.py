"""``synckit db upgrade|downgrade|current``: create and migrate the schema."""

from __future__ import annotations

import click

from synckit.cli.options import database_option, run
from synckit.store import migrate
from synckit.store.db import Database
from synckit.store.db_errors import mask_url
from synckit.store.urls import database_url_from_env

__all__ = ["db"]


@click.group("db")
def db() -> None:
    """Create and migrate the synckit schema."""


@db.command("upgrade")
@click.argument("revision", default="head")
@database_option
@click.option(
    "--app",
    "app_spec",
    envvar="SYNCKIT_APP",
    default=None,
    help="module:attribute of your synckit App (or $SYNCKIT_APP): also create or extend "
    "the records tables its streams declare.",
)
def db_upgrade(revision: str, database_url: str | None, app_spec: str | None) -> None:
    """Migrate the schema up to REVISION (default: head), and with --app the App's
    records tables."""
    app = None
    if app_spec is not None:
        from synckit.cli.app_loader import load_app

        app = load_app(app_spec)
        if revision != "head":
            raise click.UsageError("--app creates records tables at head only")

    async def go(d: Database) -> tuple[str | None, list[str]]:
        if app is not None:
            app.record_tables()  # a declaration that cannot work: one line, nothing done
        await migrate.upgrade(d, revision)
        done = await app.upgrade_records(d) if app is not None else []
        return await migrate.current(d), done

    rev, done = run(go, database_url, schema=False)
    for line in done:
        click.echo(line)
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

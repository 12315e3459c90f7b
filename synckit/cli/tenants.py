"""``synckit tenants add|ls|show|set-config|pause|resume|remove``: manage tenants.

Commands that need the connector classes (``add`` validates the config with the
connector's model) take ``--app module:attribute`` naming a :class:`synckit.App`
(or ``$SYNCKIT_APP``).
``connect`` and ``reauth`` are :mod:`synckit.cli.oauth`, ``import`` is
:mod:`synckit.cli.bulk`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from synckit.cli.app_loader import app_option, app_option_saying, load_app
from synckit.cli.options import (
    CliError,
    LazyGroup,
    cell,
    console,
    database_option,
    json_text,
    page_options,
    plain,
    read_json_file,
    run,
)
from synckit.cli.options import markup_escaped as escape  # control characters too
from synckit.connectors.schedule import DEFAULT_SCHEDULE
from synckit.errors.exceptions import ConfigurationError
from synckit.redaction import redact
from synckit.runtime.admin import tenants as store
from synckit.runtime.admin.tenant_pages import (
    Checkpoint,
    TenantPage,
    page_tenants,
    read_checkpoints,
    read_tenant,
)
from synckit.store.connections import CONNECTION_STATUSES

# Annotations only: the App (with the whole runtime and httpx) loads with --app.
if TYPE_CHECKING:
    from pydantic import BaseModel

    from synckit.app import App
    from synckit.store.db import Database


def _parse_config(config: str | None, config_file: str | None, sets: tuple[str, ...]) -> Any:
    data: Any = {}
    if config is not None and config_file is not None:
        raise CliError("give --config or --config-file, not both")
    if config is not None:
        data = json_text(config, "--config")
    elif config_file is not None:
        # One reader for config files: size cap, UTF-8, nesting, each a one-line error.
        data = read_json_file(config_file, "--config-file")
    if not isinstance(data, dict):
        raise CliError(f"config must be a JSON object, not {type(data).__name__}")
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set {item!r}: expected KEY=VALUE")
        try:
            data[key] = json.loads(raw)
        except RecursionError:
            raise CliError(f"--set {key} is nested too deeply") from None
        except ValueError:
            data[key] = raw  # a bare string
    return data


def _model(app: App | None, connector: str) -> type[BaseModel] | None:
    if app is None:
        return None
    try:
        return app.connector(connector).config_model
    except ConfigurationError:  # a connector this App does not know: by what is sealed
        return None


def _shown_config(t: store.Tenant, app: App | None) -> Any:
    """The config with every secret masked: those stored sealed, and (with ``--app``)
    every value the connector's model types as a secret, at any depth."""
    if t.config_error is not None:
        return f"<unreadable: {t.config_error}>"
    return store.shown_config(t, _model(app, t.connector))


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


def _tenant_json(t: store.Tenant, app: App | None) -> dict[str, Any]:
    data = {
        "tenant": t.tenant,
        "connector": t.connector,
        "status": t.status,
        "status_reason": redact(t.status_reason),
        "schedule": t.schedule,
        "resource_key": t.resource_key,
        "config": _shown_config(t, app),
        "has_tokens": t.has_tokens,
        "created_at": _iso(t.created_at),
        "updated_at": _iso(t.updated_at),
    }
    if t.unreadable:
        # What a corrupt row holds instead of a value, by column.
        data["unreadable"] = redact(dict(t.unreadable))
    return data


def _status(t: store.Tenant) -> str:
    return f"{t.status} (unknown)" if "status" in dict(t.unreadable) else t.status


@click.group(
    cls=LazyGroup,
    lazy={
        # New tokens for a connection, which resumes it (authlib: loaded when used).
        "connect": (
            "synckit.cli.oauth:connect_command",
            "Authorise TENANT in a browser (authorization code + PKCE) and resume it.",
        ),
        "reauth": (
            "synckit.cli.oauth:reauth_command",
            "Store TENANT's newly authorised tokens and make its connection active again.",
        ),
        # Many tenants at once.
        "import": (
            "synckit.cli.bulk:import_command",
            "Add the tenants of FILE: JSON lines, or CSV when it ends in .csv.",
        ),
    },
)
def tenants() -> None:
    """Add, list, inspect, pause, resume and remove tenants."""


@tenants.command("add")
@click.argument("tenant")
@click.argument("connector")
@click.option("--config", "config", help="The tenant's config as a JSON object.")
@click.option("--config-file", type=click.Path(dir_okay=False), help="A JSON file of config.")
@click.option("--set", "sets", multiple=True, help="KEY=VALUE config entry (repeatable).")
@click.option("--schedule", default=DEFAULT_SCHEDULE, show_default=True, help="'every 5m' or cron.")
@click.option("--resource-key", help="Default: <connector>:<tenant>.")
@click.option("--parent-key", help="The per-API resource. Default: api:<connector>.")
@app_option
@database_option
def tenants_add(
    tenant: str,
    connector: str,
    config: str | None,
    config_file: str | None,
    sets: tuple[str, ...],
    schedule: str,
    resource_key: str | None,
    parent_key: str | None,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """Add TENANT of CONNECTOR; its config is validated by the connector's model."""
    app = load_app(app_spec)
    data = _parse_config(config, config_file, sets)

    async def go(d: Database) -> store.Tenant:
        return await store.add_tenant(
            d,
            tenant,
            connector,
            data,
            schedule=schedule,
            resource_key=resource_key,
            parent_key=parent_key,
            app=app,
        )

    t = run(go, database_url)
    click.echo(
        f"tenant {t.tenant} added: connector {t.connector}, schedule {t.schedule!r}, "
        f"resource {t.resource_key}"
    )


#: Tenants per page that ``tenants ls --all`` reads at a time.
_ALL_PAGE = 1000


@tenants.command("ls")
@click.option("--connector", help="Only tenants of this connector.")
@click.option("--status", type=click.Choice(["active", "paused", "needs_reauth"]))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@page_options("Every tenant, a page at a time.")
@app_option_saying(
    "Also masks secrets of configs stored before synckit sealed them, by their model's types."
)
@database_option
def tenants_ls(
    connector: str | None,
    status: str | None,
    as_json: bool,
    limit: int,
    after: str | None,
    every: bool,
    app_spec: str | None,
    database_url: str | None,
) -> None:
    """List tenants by name, a page at a time (configs with --json, secrets masked).

    Tenants are counted by status over every page; the next page starts with
    --after NAME, the last tenant shown (as the table's caption or stderr says).
    """
    app = load_app(app_spec) if app_spec else None

    async def go(d: Database) -> tuple[list[store.Tenant], TenantPage]:
        size = _ALL_PAGE if every else limit
        page = await page_tenants(d, limit=size, after=after, connector=connector, status=status)
        shown = list(page.tenants)
        while every and page.next_after is not None:
            if as_json:  # streamed: each page printed before the next is read
                _echo_json(shown, app)
                shown = []
            page = await page_tenants(
                d, limit=size, after=page.next_after, connector=connector, status=status
            )
            shown += page.tenants
        return shown, page

    found, page = run(go, database_url)
    hint = None if page.next_after is None else f"--after {page.next_after}"
    if as_json:
        _echo_json(found, app)
        if hint is not None:
            click.echo(f"{len(found)} of {page.total} tenants; next page: {hint}", err=True)
        return
    if page.total:
        console.print(f"Tenants: {page.total} ({escape(_counts(page.by_status))})")
    table = Table(title="Tenants")
    for col in ("tenant", "connector", "status", "schedule", "resource", "reason"):
        table.add_column(col)
    for t in found:
        # Every cell is stored text: never read as markup (an API's "[/v1/users]").
        table.add_row(
            cell(t.tenant),
            cell(t.connector),
            cell(_status(t)),
            cell(t.schedule),
            cell(t.resource_key),
            cell(t.status_reason, 120),
        )
    if not page.total:
        table.caption = "no tenants yet: synckit tenants add TENANT CONNECTOR --app ..."
    elif not found:
        table.caption = "no tenants on this page"
    elif hint is not None:
        table.caption = escape(f"{len(found)} of {page.total}; next page: {hint}")
    console.print(table)
    for t in found:
        # What no cell shows: a timestamp, a config that does not read.
        hidden = {k: v for k, v in dict(t.unreadable).items() if k != "status"}
        if t.config_error is not None:
            hidden["config"] = t.config_error
        if hidden:
            said = "; ".join(f"{k} ({v})" for k, v in hidden.items())
            console.print(f"unreadable in tenant {escape(t.tenant)}: {escape(said)}")


def _echo_json(found: list[store.Tenant], app: App | None) -> None:
    for t in found:
        click.echo(json.dumps(_tenant_json(t, app), sort_keys=True, default=str))


def _counts(by_status: dict[str, int]) -> str:
    return ", ".join(
        f"{n} {s}" if s in CONNECTION_STATUSES else f"{n} {s} (unknown)"
        for s, n in sorted(by_status.items())
    )


@tenants.command("show")
@click.argument("tenant")
@app_option
@database_option
def tenants_show(tenant: str, app_spec: str | None, database_url: str | None) -> None:
    """Show one tenant (secrets masked), its checkpoints and dead letters, as JSON.

    What a corrupt row holds instead of a value is null, named with the reason in an
    "unreadable" object beside it (the tenant's, or a checkpoint's).
    """
    app = load_app(app_spec) if app_spec else None

    async def go(d: Database) -> dict[str, Any]:
        t = await read_tenant(d, tenant)
        data = _tenant_json(t, app)
        data["checkpoints"] = {
            c.stream: _checkpoint_json(c) for c in await read_checkpoints(d, tenant)
        }
        data["dead_letters"] = await store.dead_letter_counts(d, tenant)
        return data

    shown = redact(run(go, database_url))
    click.echo(json.dumps(shown, indent=2, sort_keys=True, default=str))


def _checkpoint_json(c: Checkpoint) -> dict[str, Any]:
    data: dict[str, Any] = {"cursor": c.cursor, "updated_at": _iso(c.updated_at)}
    if c.unreadable:
        data["unreadable"] = dict(c.unreadable)
    return data


@tenants.command("set-config")
@click.argument("tenant")
@click.option(
    "--set", "sets", multiple=True, required=True, help="FIELD=VALUE to change (repeatable)."
)
@app_option
@database_option
def tenants_set_config(
    tenant: str, sets: tuple[str, ...], app_spec: str | None, database_url: str | None
) -> None:
    """Change fields of TENANT's config, validated by its connector's model.

    Other fields are kept; an unknown field is refused by name. A tenant that needed
    re-authorisation because its credentials (an API key in its config) were refused
    is resumed. The config is printed with secrets masked.
    """
    app = load_app(app_spec)
    changes = _parse_config(None, None, sets)

    async def go(d: Database) -> tuple[store.Tenant, str]:
        before = await store.get_tenant(d, tenant)
        return await store.set_config(d, tenant, changes, app=app), before.status

    t, was = run(go, database_url)
    resumed = " (resumed: it needed re-authorisation)" if was == "needs_reauth" else ""
    click.echo(f"tenant {plain(t.tenant)}: config updated, {plain(t.status)}{resumed}")
    click.echo(json.dumps(_shown_config(t, app), indent=2, sort_keys=True, default=str))


@tenants.command("pause")
@click.argument("tenant")
@click.option("--reason", default="paused by operator", show_default=True)
@database_option
def tenants_pause(tenant: str, reason: str, database_url: str | None) -> None:
    """Pause TENANT: its jobs are not claimed and no cycle is scheduled."""
    t = run(lambda d: store.pause_tenant(d, tenant, reason), database_url)
    click.echo(f"tenant {plain(t.tenant)}: {plain(t.status)} ({plain(t.status_reason)})")


@tenants.command("resume")
@click.argument("tenant")
@database_option
def tenants_resume(tenant: str, database_url: str | None) -> None:
    """Resume a paused TENANT; overdue cycles run at once."""
    t = run(lambda d: store.resume_tenant(d, tenant), database_url)
    click.echo(f"tenant {plain(t.tenant)}: {plain(t.status)}")


@tenants.command("remove")
@click.argument("tenant")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@database_option
def tenants_remove(tenant: str, yes: bool, database_url: str | None) -> None:
    """Remove TENANT with its checkpoints (its dead letters and audit counts stay)."""
    if not yes:
        click.confirm(f"Remove tenant {tenant} and its checkpoints?", abort=True)
    t = run(lambda d: store.remove_tenant(d, tenant), database_url)
    click.echo(f"tenant {t.tenant} removed")

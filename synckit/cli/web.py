"""``synckit web``: serve the operator console (:mod:`synckit.web`, the ``web`` extra)."""

from __future__ import annotations

import os

import click

from synckit.cli.app_loader import app_option, load_app
from synckit.cli.options import CliError, database_option, run, seconds_option
from synckit.store.db_errors import mask_url
from synckit.store.urls import database_url_from_env

TOKEN_ENV = "SYNCKIT_WEB_TOKEN"


@click.command("web")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    default=None,
    help=f"Access token (at least 16 characters); required to listen beyond loopback "
    f"(or ${TOKEN_ENV}).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="A public host name the console answers to (repeatable; needs --token). "
    "Requests naming any other non-loopback Host get 400.",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@seconds_option("--refresh", 0.5, 60.0, 2.0, "Seconds between live updates of a page.")
@database_option
def web_command(
    app_spec: str | None,
    host: str,
    port: int,
    token: str | None,
    allowed_hosts: tuple[str, ...],
    read_only: bool,
    refresh: float,
    database_url: str | None,
) -> None:
    """Serve the operator console: overview, tenants (and why they wait), jobs, dead
    letters, outbox; live, with actions (pause, resume, sync now, re-authorise, reset
    breaker, retry, cancel, replay, resolve, ignore).

    Listens on 127.0.0.1 unless told otherwise; any other address needs --token.
    With --app, "sync now", re-authorising (the OAuth connect flow, back to
    /oauth/callback), record replays and the connectors' secret fields are known.
    """
    # The console is the web extra (Starlette, Jinja2, uvicorn; synckit.web's package
    # imports them): imported here, so that every other command works without it.
    try:
        import uvicorn

        from synckit.web.app import create_app
        from synckit.web.base import WebConfig
        from synckit.web.security import bind_refusal
    except ImportError as exc:
        raise CliError(
            f"synckit web needs the web extra: pip install 'synckit[web]' ({exc.name} missing)"
        ) from None
    refusal = bind_refusal(host, token or None)
    if refusal is not None:
        raise CliError(refusal)
    if allowed_hosts and not token:
        raise CliError("--allowed-host needs --token: only loopback names are served without one")
    app = load_app(app_spec) if app_spec else None
    if app is not None:
        app.use_database_url(database_url)
        database_url = database_url or app.database_url or os.environ.get("SYNCKIT_DATABASE_URL")
    config = WebConfig(
        database_url=database_url,
        app=app,
        token=token or None,
        read_only=read_only,
        refresh_seconds=refresh,
        allowed_hosts=tuple(allowed_hosts),
    )

    async def ready(_db: object) -> None:
        return None

    # A missing or outdated schema is one line here, not a failed server start.
    run(ready, database_url)
    where = f"[{host}]" if ":" in host else host
    click.echo(
        f"synckit web on http://{where}:{port} ({mask_url(database_url_from_env(database_url))}"
        f"{', read-only' if read_only else ''})",
        err=True,
    )
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )

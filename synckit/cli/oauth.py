"""``synckit tenants connect|reauth``: give a tenant its tokens and resume its jobs.

The ``tenants`` group owns the command line of tenants; it attaches these commands.

``connect`` runs the authorization-code flow with PKCE: it listens on a loopback port,
prints the provider's consent URL, and completes the flow when the browser comes back
(:mod:`synckit.runtime.credentials.authorize`); the connector's ``OAuth2Config`` comes from the
auth it builds for the tenant.

``reauth`` stores tokens obtained elsewhere. A refresh token alone is enough (the first
request refreshes). Tokens are read from the options, from
``$SYNCKIT_REAUTH_ACCESS_TOKEN`` / ``$SYNCKIT_REAUTH_REFRESH_TOKEN`` (which keep them out
of shell history and process listings), or from a hidden prompt; they are never echoed.
"""

from __future__ import annotations

from datetime import timedelta

import click

from synckit.cli.app_loader import app_option, load_app
from synckit.cli.options import CliError, database_option, run, seconds_option
from synckit.clock import utcnow
from synckit.runtime.admin.actions import oauth_config_for
from synckit.runtime.credentials.authorize import (
    begin_authorization,
    complete_authorization,
    receive_callback,
)
from synckit.runtime.credentials.oauth import ReauthResult, reauth
from synckit.runtime.credentials.secrets import TokenSet
from synckit.store.db import Database


@click.command("reauth")
@click.argument("tenant")
@click.option(
    "--access-token",
    envvar="SYNCKIT_REAUTH_ACCESS_TOKEN",
    default=None,
    help="The new access token (or $SYNCKIT_REAUTH_ACCESS_TOKEN).",
)
@click.option(
    "--refresh-token",
    envvar="SYNCKIT_REAUTH_REFRESH_TOKEN",
    default=None,
    help="The new refresh token (or $SYNCKIT_REAUTH_REFRESH_TOKEN); enough on its own.",
)
@click.option(
    "--expires-in",
    type=click.IntRange(0, 100 * 366 * 86_400),
    default=None,
    help="Seconds until the access token expires (unknown if omitted: a 401 will tell).",
)
@click.option("--scope", default=None, help="The scope the tokens were granted.")
@database_option
def reauth_command(
    tenant: str,
    access_token: str | None,
    refresh_token: str | None,
    expires_in: int | None,
    scope: str | None,
    database_url: str | None,
) -> None:
    """Store TENANT's newly authorised tokens and make its connection active again.

    Give a refresh token, an access token, or both; with neither, both are prompted for
    (hidden; leave one empty). Jobs the connection held back while it needed
    re-authorisation are claimed again at once.
    """
    if access_token is None and refresh_token is None:
        refresh_token = click.prompt(
            "Refresh token (empty if none)", default="", hide_input=True, show_default=False
        )
        if not (refresh_token or "").strip():
            access_token = click.prompt("Access token", default="", hide_input=True)
    access = (access_token or "").strip() or None
    refresh = (refresh_token or "").strip() or None
    if access is None and refresh is None:
        raise CliError("give --refresh-token or --access-token (neither may be empty)")
    now = utcnow()
    token_set = TokenSet(
        access_token=access,
        refresh_token=refresh,
        expires_at=now + timedelta(seconds=expires_in)
        if expires_in is not None and access
        else None,
        scope=scope,
        issued_at=now if access else None,
    )

    async def go(db: Database) -> ReauthResult:
        return await reauth(db, tenant, token_set, now=now)

    result = run(go, database_url)
    first = "" if access else " (the first request refreshes the access token)"
    click.echo(
        f"tenant {result.tenant!r} ({result.connector}) re-authorised: connection active "
        f"(was {result.previous_status}); jobs of {result.resource_key!r} resume{first}"
    )


@click.command("connect")
@click.argument("tenant")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback address.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="Listener port (default: free)."
)
@click.option("--path", "callback_path", default="/callback", show_default=True)
@click.option("--scope", default=None, help="Scope to ask for (default: the connector's).")
@seconds_option("--wait", 1, 86_400, 300, "Seconds to wait for the browser to come back.")
@database_option
def connect_command(
    tenant: str,
    app_spec: str | None,
    host: str,
    port: int,
    callback_path: str,
    scope: str | None,
    wait: float,
    database_url: str | None,
) -> None:
    """Authorise TENANT in a browser (authorization code + PKCE) and resume it.

    Prints the provider's consent URL and listens on a loopback port for the redirect;
    the tokens are stored sealed and the tenant's connection becomes active.
    """
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise CliError(f"--host {host!r}: the callback listener must be a loopback address")
    app = load_app(app_spec)

    async def go(db: Database) -> ReauthResult:
        config = await oauth_config_for(app, db, tenant)

        async def ready(bound: int) -> None:
            shown = f"[{host}]" if ":" in host else host
            redirect = f"http://{shown}:{bound}{callback_path}"
            url = await begin_authorization(db, tenant, config, redirect_uri=redirect, scope=scope)
            click.echo(f"Open this URL to authorise tenant {tenant!r}:", err=True)
            click.echo(url)
            click.echo(f"Waiting for the redirect to {redirect} ...", err=True)

        async def handle(callback_url: str) -> ReauthResult:
            return await complete_authorization(
                db, tenant, config, callback_url, network=app.network
            )

        try:
            return await receive_callback(host, port, callback_path, handle, wait=wait, ready=ready)
        except TimeoutError:
            raise CliError(f"no authorisation came back within {wait:g}s") from None

    result = run(go, database_url)
    click.echo(
        f"tenant {result.tenant!r} ({result.connector}) connected: connection active "
        f"(was {result.previous_status}); jobs of {result.resource_key!r} resume"
    )


__all__ = ["connect_command", "reauth_command"]

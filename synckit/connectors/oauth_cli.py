"""``synckit tenants reauth``: store a tenant's new tokens and resume its jobs.

The ``tenants`` group owns the command line of tenants; it attaches this command with
``tenants.add_command(reauth_command)``. Tokens are read from the options, from
``$SYNCKIT_REAUTH_ACCESS_TOKEN`` / ``$SYNCKIT_REAUTH_REFRESH_TOKEN`` (which keep them out
of shell history and process listings), or from a hidden prompt; they are never echoed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from synckit.connectors.oauth import ReauthResult
from synckit.runtime.db import ENV_URL, Database


@click.command("reauth")
@click.argument("tenant")
@click.option(
    "--access-token",
    envvar="SYNCKIT_REAUTH_ACCESS_TOKEN",
    prompt="Access token",
    hide_input=True,
    help="The new access token (or $SYNCKIT_REAUTH_ACCESS_TOKEN; prompted if absent).",
)
@click.option(
    "--refresh-token",
    envvar="SYNCKIT_REAUTH_REFRESH_TOKEN",
    default=None,
    help="The new refresh token (or $SYNCKIT_REAUTH_REFRESH_TOKEN).",
)
@click.option(
    "--expires-in",
    type=click.IntRange(min=0),
    default=None,
    help="Seconds until the access token expires (unknown if omitted: a 401 will tell).",
)
@click.option("--scope", default=None, help="The scope the tokens were granted.")
@click.option(
    "--database-url",
    "database_url",
    envvar=ENV_URL,
    default=None,
    help=f"Database URL (default: ${ENV_URL}, else sqlite:///synckit.db).",
)
def reauth_command(
    tenant: str,
    access_token: str,
    refresh_token: str | None,
    expires_in: int | None,
    scope: str | None,
    database_url: str | None,
) -> None:
    """Store TENANT's newly authorised tokens and make its connection active again.

    Jobs the tenant's connection held back while it needed re-authorisation are claimed
    again at once.
    """
    # synckit.cli imports the command groups that attach this command: import it late.
    from synckit.cli import CliError, run

    if not access_token.strip():
        raise CliError("--access-token must not be empty")
    # Imported here: authlib is heavy, and every `synckit` command loads this module.
    from synckit.connectors.oauth import reauth
    from synckit.connectors.secrets import TokenSet, utcnow

    now = utcnow()
    token_set = TokenSet(
        access_token=access_token.strip(),
        refresh_token=(refresh_token or "").strip() or None,
        expires_at=now + timedelta(seconds=expires_in) if expires_in is not None else None,
        scope=scope,
    )

    async def go(db: Database) -> ReauthResult:
        return await reauth(db, tenant, token_set, now=now)

    result = run(go, database_url)
    click.echo(
        f"tenant {result.tenant!r} ({result.connector}) re-authorised: connection active "
        f"(was {result.previous_status}); jobs of {result.resource_key!r} resume"
    )


__all__ = ["reauth_command"]

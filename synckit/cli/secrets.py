"""``synckit secrets keygen|check|rotate``: the key that seals tokens and config secrets."""

from __future__ import annotations

import base64
import json
import os
from typing import TYPE_CHECKING

import click

from synckit.cli.app_loader import app_option, load_app
from synckit.cli.options import CliError, database_option, run

# ``keygen`` needs none of the database, the runtime or cryptography: the subcommands
# that do import them.
if TYPE_CHECKING:
    from synckit.store.db import Database


@click.group("secrets")
def secrets_group() -> None:
    """Make a key, check that it opens every stored secret, re-seal under a new key.

    Token sets, the secret fields of tenant configs and pending PKCE verifiers are
    sealed with $SYNCKIT_SECRET_KEY. To rotate: set SYNCKIT_SECRET_KEY="new,old"
    everywhere, run `synckit secrets rotate`, then drop the old key.
    """


@secrets_group.command("keygen")
def secrets_keygen() -> None:
    """Print a new key for SYNCKIT_SECRET_KEY."""
    # What Fernet.generate_key() does (32 random bytes, URL-safe base64), without
    # importing cryptography; tests/e2e/test_cli_secrets.py opens a token with the key.
    click.echo(base64.urlsafe_b64encode(os.urandom(32)).decode())


@secrets_group.command("check")
@database_option
def secrets_check(database_url: str | None) -> None:
    """Exit non-zero, naming the missing key and the tenants, unless every active
    tenant's tokens and config open with $SYNCKIT_SECRET_KEY (what a worker checks
    at start)."""
    from synckit.runtime.credentials import keys
    from synckit.runtime.credentials.secrets import TokenCipher

    cipher = TokenCipher.from_env()

    async def go(d: Database) -> str | None:
        return keys.describe_unopenable(await keys.find_unopenable(d, cipher), cipher)

    problem = run(go, database_url)
    if problem is not None:
        raise CliError(problem)
    held = ", ".join(cipher.key_ids) or "none"
    click.echo(f"every active tenant's secrets open (keys: {held})")


@secrets_group.command("rotate")
@app_option
@click.option("--json", "as_json", is_flag=True, help="Print the counts as one JSON object.")
@database_option
def secrets_rotate(app_spec: str | None, as_json: bool, database_url: str | None) -> None:
    """Re-seal every token set, config secret and pending verifier under the first key
    of $SYNCKIT_SECRET_KEY (give the old keys after it). Idempotent.

    With --app, plaintext secrets in configs stored before synckit sealed them are
    sealed too (the connectors' models say which fields are secrets).
    """
    from synckit.runtime.credentials import keys
    from synckit.runtime.credentials.secrets import ENV_KEY, TokenCipher

    models = keys.models_of(load_app(app_spec).connectors) if app_spec else None
    cipher = TokenCipher.from_env()
    if not cipher.encrypts:
        raise CliError(f"{ENV_KEY} is not set: give the new key first, then the old ones")
    # Rotation is also the way out of development plaintext: read it, seal it.
    cipher.insecure_dev = True

    result = run(lambda d: keys.rotate_secrets(d, cipher, models=models), database_url)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "key": result.key_id,
                    "token_sets": result.token_sets,
                    "configs": result.configs,
                    "verifiers": result.verifiers,
                    "resealed": result.total,
                    "unreadable": [{"tenant": t, "reason": r} for t, r in result.unreadable],
                    "unchecked": result.unchecked,
                },
                sort_keys=True,
            )
        )
    else:
        click.echo(
            f"re-sealed {result.total} under key {result.key_id}: {result.token_sets} token "
            f"sets, {result.configs} configs, {result.verifiers} pending verifiers"
        )
        if result.unchecked and models is None:
            click.echo(
                f"{result.unchecked} configs checked for sealed values only: pass --app to "
                "seal secrets stored in plaintext before synckit sealed them"
            )
    if result.unreadable:
        first = "; ".join(f"{t}: {r}" for t, r in result.unreadable[:3])
        more = len(result.unreadable) - 3
        raise CliError(
            f"{len(result.unreadable)} rows could not be opened and were left as they are "
            f"({first}{f' and {more} more' if more > 0 else ''})"
        )

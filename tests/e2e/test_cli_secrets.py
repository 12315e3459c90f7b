"""`synckit secrets ...`, the worker's key check at start, and what `tenants ls/show`
print of secrets and stored text: run as subprocesses, on both engines."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography.fernet import Fernet
from secrets_app import Vault
from sqlalchemy import update
from waits import PROCESS_TIMEOUT  # tests/

from synckit.runtime.admin.tenants import add_tenant
from synckit.runtime.credentials.secrets import TokenCipher, key_id
from synckit.store.db import Database, open_database
from synckit.store.tables import connections

APPS = Path(__file__).parents[1] / "apps"
T = TypeVar("T")
APP = "secrets_app:app"
K1, K2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
PAT, HOOK, KEY = "pat-0f1e2d3c4b", "https://hooks.example/T1/B2/Zsecret", "api-9a8b7c6d5e"
CONFIG = {"api_key": KEY, "auth": {"user": "ann", "pat": PAT, "webhook_url": HOOK}}
MARKUP = "Invalid path [/v1/users] [bold red]x[/bold red] [/]"


def with_db(url: str, make: Callable[[Database], Awaitable[T]]) -> T:
    async def go() -> T:
        db = open_database(url)
        try:
            return await make(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


def synckit(url: str | None, *args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SYNCKIT_SECRET_KEY"}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env["COLUMNS"] = "300"
    if key is not None:
        env["SYNCKIT_SECRET_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "synckit.cli", *args, *(["--database-url", url] if url else [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=PROCESS_TIMEOUT,
    )


class Result:
    """A command's exit code and output, run in this process (click's runner)."""

    def __init__(self, args: tuple[str, ...], key: str | None) -> None:
        from click.testing import CliRunner

        from synckit.cli import cli

        got = CliRunner().invoke(cli, list(args), env={"SYNCKIT_SECRET_KEY": key, "COLUMNS": "300"})
        assert got.exception is None or isinstance(got.exception, SystemExit), got.output
        self.args, self.returncode = args, got.exit_code
        self.stdout, self.stderr = got.stdout, got.stderr


def cli(url: str | None, *args: str, key: str | None) -> Result:
    return Result((*args, *(["--database-url", url] if url else [])), key)


def seed(url: str, *names: str, config: dict[str, Any] = CONFIG) -> None:
    async def go(db: Database) -> None:
        for name in names:
            await add_tenant(db, name, Vault, config)

    os.environ["SYNCKIT_SECRET_KEY"] = K1
    with_db(url, go)


@pytest.fixture(autouse=True)
def _restore_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", K1)


def test_the_worker_refuses_to_start_naming_the_missing_key_and_tenants(
    migrated_url: str,
) -> None:
    """Sealed under k1: a worker with k2 exits 2 with one line naming k1's id and the
    tenant; with no key it says so; with "k2,k1" it runs."""
    seed(migrated_url, "acme")
    wrong = synckit(migrated_url, "worker", "--burst", "--app", APP, key=K2)
    assert wrong.returncode == 2, wrong.stderr
    line = wrong.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot open the secrets of 1 active tenant:"), line
    assert f"key {key_id(K1)} is missing" in line and f"holds {key_id(K2)}" in line
    assert "tenants acme" in line and "Traceback" not in wrong.stderr
    none = synckit(migrated_url, "worker", "--burst", "--app", APP, key=None)
    assert none.returncode == 2 and "SYNCKIT_SECRET_KEY is not set" in none.stderr
    both = synckit(migrated_url, "worker", "--burst", "--app", APP, key=f"{K2},{K1}")
    assert both.returncode == 0, both.stderr


def test_rotate_counts_reseals_once_and_then_the_new_key_alone_works(
    migrated_url: str,
) -> None:
    """`secrets rotate` under "k2,k1" re-seals both configs (a count), a second run 0;
    then `secrets check` and a worker pass with k2 alone, and fail with k1 alone."""
    seed(migrated_url, "acme", "globex")
    first = cli(migrated_url, "secrets", "rotate", "--json", "--app", APP, key=f"{K2},{K1}")
    assert first.returncode == 0, first.stderr
    counts = json.loads(first.stdout)
    assert (counts["configs"], counts["resealed"], counts["key"]) == (2, 2, key_id(K2))
    again = cli(migrated_url, "secrets", "rotate", "--app", APP, key=f"{K2},{K1}")
    assert again.returncode == 0 and f"re-sealed 0 under key {key_id(K2)}" in again.stdout
    check = cli(migrated_url, "secrets", "check", key=K2)
    assert check.returncode == 0, check.stderr
    worker = synckit(migrated_url, "worker", "--burst", "--app", APP, key=K2)
    assert worker.returncode == 0, worker.stderr
    old = cli(migrated_url, "secrets", "check", key=K1)
    assert old.returncode == 2 and f"key {key_id(K2)} is missing" in old.stderr
    nokey = cli(migrated_url, "secrets", "rotate", key=None)
    assert nokey.returncode == 2 and "SYNCKIT_SECRET_KEY is not set" in nokey.stderr
    keygen = cli(None, "secrets", "keygen", key=None)
    assert keygen.returncode == 0 and TokenCipher([keygen.stdout.strip()]).encrypts


def test_tenants_ls_and_show_mask_every_secret_by_type_and_print_text_as_data(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealed secrets are masked without --app; a legacy plaintext row's `pat` and
    `webhook_url` (names no rule knows) are masked by the model's types with --app;
    a reason with `[/v1/users]` renders as it is."""
    from rich.console import Console

    from synckit.cli import breakers, dlq, jobs, outbox, status, tenants

    wide = Console(width=400)  # every command module that prints tables
    for module in (breakers, dlq, jobs, outbox, status, tenants):
        monkeypatch.setattr(module, "console", wide)
    seed(migrated_url, "acme", "legacy")

    async def go(db: Database) -> None:
        async with db.begin() as conn:
            await conn.execute(
                update(connections)
                .where(connections.c.tenant == "legacy")
                .values(config=CONFIG, status="needs_reauth", status_reason=MARKUP)
            )

    with_db(migrated_url, go)
    plain = cli(migrated_url, "tenants", "ls", "--json", key=None)
    assert plain.returncode == 0, plain.stderr
    acme = json.loads(plain.stdout.splitlines()[0])
    assert acme["config"]["auth"] == {"user": "ann", "pat": "***", "webhook_url": "***"}
    outputs = [
        cli(migrated_url, "tenants", "ls", "--json", "--app", APP, key=None),
        cli(migrated_url, "tenants", "show", "legacy", "--app", APP, key=None),
        cli(migrated_url, "tenants", "show", "acme", key=None),
        cli(migrated_url, "tenants", "ls", key=None),
    ]
    for result in outputs:
        assert result.returncode == 0, result.stderr
        for secret in (PAT, HOOK, KEY):
            assert secret not in result.stdout, (result.args, secret)
    legacy = json.loads(outputs[1].stdout)
    assert legacy["config"]["auth"]["pat"] == "***" and legacy["status_reason"] == MARKUP
    assert "Invalid path [/v1/users] [bold red]x[/bold red]" in outputs[3].stdout


@pytest.mark.parametrize("command", [("secrets", "check"), ("secrets", "rotate")])
def test_a_key_that_is_not_a_key_is_one_line(migrated_url: str, command: tuple[str, ...]) -> None:
    """$SYNCKIT_SECRET_KEY that is no Fernet key, read by a command before it enters the
    core: one line naming the variable and how to make a key, exit 2, no traceback."""
    got = cli(migrated_url, *command, key="not-a-fernet-key")
    assert got.returncode == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1, got.stderr
    assert lines[0].startswith("error: SYNCKIT_SECRET_KEY is not a valid Fernet key"), lines
    assert "synckit secrets keygen" in lines[0]

"""`synckit status` into a pipe (no terminal, no $COLUMNS) prints whole cells: a long
tenant name and its reason are on one line, never cut to a few letters (both engines)."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from synckit import App
from synckit.cli import cli
from synckit.runtime.admin.tenants import add_tenant, pause_tenant
from synckit.store.db import open_database
from tests.apps.quiet_app import Quiet

LONG = "northwind-traders-emea-production"
REASON = "billing hold until the customer's invoice 2026-0042 is settled"


def test_status_in_a_pipe_keeps_every_cell_whole(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tenant is one line holding its full name, connector and status reason."""

    async def seed() -> None:
        db = open_database(migrated_url)
        try:
            await add_tenant(db, LONG, "quiet", app=App([Quiet]))
            await pause_tenant(db, LONG, reason=REASON[:40])
        finally:
            await db.dispose()

    asyncio.run(seed())
    monkeypatch.delenv("COLUMNS", raising=False)
    result = CliRunner().invoke(cli, ["status", "--database-url", migrated_url])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if LONG in line]
    assert "paused: " + REASON[:40] in line
    assert "\x1b[" not in result.stdout  # no colour codes

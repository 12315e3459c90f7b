"""`synckit sync --all` and `--connector NAME` enqueue a cycle for every active tenant (of
that connector), naming the ones skipped; exactly one of TENANT, --all, --connector.
Run in process with click's CliRunner, on both engines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from synckit.cli import cli as main
from synckit.store.db import open_database
from synckit.store.jobs.admin import list_jobs

APP = """
from synckit import App, Connector, Page


class Crm(Connector):
    name = "crm"

    async def poll(self, ctx, checkpoint):
        yield Page([], checkpoint=None)

    async def handle(self, ctx, record):
        pass


class Billing(Connector):
    name = "billing"

    async def poll(self, ctx, checkpoint):
        yield Page([], checkpoint=None)

    async def handle(self, ctx, record):
        pass


app = App([Crm, Billing])
"""


@pytest.fixture
def cli(tmp_path: Path, migrated_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    (tmp_path / "many_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SYNCKIT_DATABASE_URL", migrated_url)
    runner = CliRunner()
    for tenant, connector in [("a1", "crm"), ("a2", "crm"), ("b1", "billing")]:
        added = runner.invoke(main, ["tenants", "add", tenant, connector, "--app", "many_app:app"])
        assert added.exit_code == 0, added.output
    paused = runner.invoke(main, ["tenants", "pause", "a2"])
    assert paused.exit_code == 0, paused.output
    return runner


def poll_tenants(url: str) -> list[str]:
    async def go() -> list[str]:
        db = open_database(url)
        try:
            return sorted(str(j.resource_key).split(":")[1] for j in await list_jobs(db))
        finally:
            await db.dispose()

    return asyncio.run(go())


def test_connector_syncs_its_active_tenants_and_names_the_skipped(
    cli: CliRunner, migrated_url: str
) -> None:
    """--connector crm: a1 enqueued, a2 (paused) skipped and said so, b1 untouched."""
    result = cli.invoke(main, ["sync", "--connector", "crm", "--json", "--app", "many_app:app"])
    assert result.exit_code == 0, result.output
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["tenant"] for d in docs] == ["a1"]
    assert "a2: skipped, paused" in result.stderr
    assert poll_tenants(migrated_url) == ["a1"]


def test_all_syncs_every_active_tenant(cli: CliRunner, migrated_url: str) -> None:
    """--all: a1 and b1, each with its cycle."""
    result = cli.invoke(main, ["sync", "--all", "--app", "many_app:app"])
    assert result.exit_code == 0, result.output
    assert "a1/default: cycle enqueued" in result.stderr
    assert "b1/default: cycle enqueued" in result.stderr
    assert poll_tenants(migrated_url) == ["a1", "b1"]


@pytest.mark.parametrize(
    "args", [[], ["a1", "--all"], ["--all", "--connector", "crm"], ["--connector", "nope"]]
)
def test_one_target_exactly(cli: CliRunner, migrated_url: str, args: list[str]) -> None:
    """None, or two, of TENANT/--all/--connector, or a connector with no active tenant:
    one line, exit 2, nothing enqueued."""
    result = cli.invoke(main, ["sync", *args, "--app", "many_app:app"])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "error:" in result.stderr
    assert poll_tenants(migrated_url) == []

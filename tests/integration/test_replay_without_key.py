"""Issue 34, "no accidental loss": a replay that cannot run because of configuration (no
``$SYNCKIT_SECRET_KEY``, a wrong one, no App) leaves every dead letter as it was, and says
why in plain words: in the processor, the CLI and the console; on both engines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from starlette.testclient import TestClient
from web_app import app, seed

from synckit.clock import utcnow
from synckit.dlq.replay import ReplayProcessor, replayers_from_app
from synckit.runtime.admin.tenants import get_tenant
from synckit.store.db import Database
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters.rows import DlqFilter
from synckit.web import WebConfig, create_app
from synckit.web.base import CSRF_COOKIE

APPS = Path(__file__).resolve().parents[1] / "apps"
FIELDS = ("status", "status_reason", "next_retry_at", "replay_attempts", "resolved_at")

LOCAL = "http://127.0.0.1"  # the Host a loopback console answers to


async def snapshot(db: Database, ids: list[int]) -> dict[int, tuple[Any, ...]]:
    rows = [await dlq_reads.get(db, i) for i in ids]
    return {r.id: (*tuple(getattr(r, f) for f in FIELDS), r.lease_token) for r in rows}


async def seeded(db: Database) -> list[int]:
    """The web app's seed; one acme row moved to review, so both open statuses are held."""
    ids: list[int] = (await seed(db))["dead_letters"]
    async with db.begin() as conn:
        row = await dlq_reads.get(db, ids[0])
        await dlq_replay.mark_review(conn, row, "sent to review by a test", now=row.first_failed_at)
    return ids


@pytest.mark.parametrize("key", ["unset", "wrong"])
async def test_an_operators_replay_without_the_key_changes_no_row(
    db: Database, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    ids = await seeded(db)
    acme = ids[:3]
    before = await snapshot(db, ids)
    if key == "unset":
        monkeypatch.delenv("SYNCKIT_SECRET_KEY")
        cause = "SYNCKIT_SECRET_KEY is not set"
    else:
        monkeypatch.setenv("SYNCKIT_SECRET_KEY", Fernet.generate_key().decode())
        cause = "does not hold the key"
    replayers, registry = replayers_from_app(app, db)
    summary = await ReplayProcessor(db, replayers, registry=registry).replay_matching(
        DlqFilter(tenants=("acme",))
    )
    assert summary.blocked == 3 and summary.claimed == 3
    assert summary.resolved == summary.ignored == summary.retry == summary.review == 0
    [(outcome, reason)] = summary.reasons
    assert outcome == "blocked" and cause in reason and "'api_key'" in reason, reason
    assert await snapshot(db, ids) == before
    assert [(await dlq_reads.get(db, i)).status for i in acme] == ["review", "pending", "pending"]


async def test_an_automatic_replay_without_the_key_spends_no_attempt(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await seeded(db)
    monkeypatch.delenv("SYNCKIT_SECRET_KEY")
    pending = ids[1:3]
    replayers, registry = replayers_from_app(app, db)
    later = utcnow() + timedelta(days=2)  # every seeded row is due by then
    summary = await ReplayProcessor(
        db, replayers, registry=registry, clock=lambda: later
    ).run_once()
    assert summary.blocked >= 2 and summary.ignored == summary.resolved == 0
    for i in pending:
        row = await dlq_reads.get(db, i)
        assert row.status == "pending" and row.replay_attempts == 0
        assert row.next_retry_at is not None and row.lease_token is None


async def test_with_the_key_the_same_replay_runs(db: Database) -> None:
    ids = await seeded(db)
    await get_tenant(db, "acme")  # the conftest's key opens it
    replayers, registry = replayers_from_app(app, db)
    summary = await ReplayProcessor(db, replayers, registry=registry).replay_ids(ids[:3])
    assert summary.resolved == 3 and summary.blocked == 0


async def test_the_cli_refuses_with_the_cause_and_changes_nothing(
    db: Database, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await seeded(db)
    before = await snapshot(db, ids)
    env = {k: v for k, v in os.environ.items() if k != "SYNCKIT_SECRET_KEY"}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "300"
    result = subprocess.run(  # noqa: ASYNC221 - nothing else runs meanwhile
        [
            sys.executable,
            "-m",
            "synckit.cli",
            "dlq",
            "replay",
            "--tenant",
            "acme",
            "--app",
            "web_app:app",
            "--database-url",
            migrated_url,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert "3 dead letter(s) not replayed and left unchanged" in last, result.stderr
    assert "SYNCKIT_SECRET_KEY is not set" in last
    assert await snapshot(db, ids) == before


@contextmanager
def console(url: str, **options: Any) -> Iterator[TestClient]:
    config = WebConfig(database_url=url, app=app, **options)
    with TestClient(create_app(config), base_url=LOCAL, follow_redirects=False) as client:
        client.get("/login")
        yield client


def replay(client: TestClient, **form: Any) -> str:
    token = client.cookies.get(CSRF_COOKIE)
    r = client.post("/dlq/action", data={"csrf": token, "action": "replay", **form})
    assert r.status_code == 303
    page = client.get(r.headers["location"]).text
    found = re.search(r'<p class="flash( bad)?" id="flash"[^>]*>(.*?)</p>', page, re.S)
    assert found, page
    return ("!" if found.group(1) else "") + unescape(found.group(2))


async def test_the_console_refuses_with_the_cause_and_changes_nothing(
    db: Database, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await seeded(db)
    before = await snapshot(db, ids)
    monkeypatch.delenv("SYNCKIT_SECRET_KEY")
    with console(migrated_url) as client:
        flash = replay(client, ids=[str(i) for i in ids[:3]])
        # Pause and resume need no key.
        token = client.cookies.get(CSRF_COOKIE)
        assert client.post("/tenants/acme/pause", data={"csrf": token}).status_code == 303
        page = client.get("/tenants/acme").text
        assert "paused in the console" in page
        client.post("/tenants/acme/resume", data={"csrf": token})
    assert flash.startswith("!"), flash  # styled as an error
    assert "3 NOT replayed, left unchanged" in flash and "SYNCKIT_SECRET_KEY is not set" in flash
    assert await snapshot(db, ids) == before


async def test_the_console_without_app_leaves_record_rows_and_says_it_needs_app(
    db: Database, migrated_url: str
) -> None:
    ids = await seeded(db)
    before = await snapshot(db, ids)
    config = WebConfig(database_url=migrated_url, app=None)
    with TestClient(create_app(config), base_url=LOCAL, follow_redirects=False) as client:
        client.get("/login")
        flash = replay(client, ids=[str(i) for i in ids])
    assert flash.startswith("!") and "needs --app" in flash, flash
    assert await snapshot(db, ids) == before

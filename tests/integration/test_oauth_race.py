"""The refresh race: 16 jobs in 4 OS processes hit one expired token at the same instant.

The provider rotates refresh tokens, revokes a refresh token on first use and, if one is
used twice, every token of that authorisation; its token endpoint is slow (0.3 s), so
any refresh that is not single-flight overlaps another and is caught.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select
from waits import PROCESS_TIMEOUT, wait_until  # tests/

from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config, reauth
from synckit.runtime.credentials.secrets import TokenCipher, TokenSet
from synckit.store.db import open_database
from synckit.store.tables import connections
from synckit.testing.oauth_server import OAuthTestServer

APP = Path(__file__).parent.parent / "apps" / "oauth_app.py"
PROCESSES, TASKS = 4, 4


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", key)
    return key


def seed(url: str, tokens: dict[str, str], expires_at: datetime) -> None:
    async def go() -> None:
        db = open_database(url)
        now = datetime.now(UTC)
        try:
            async with db.begin() as conn:
                await conn.execute(
                    insert(connections).values(
                        tenant="acme",
                        connector="demo",
                        resource_key="demo:acme",
                        created_at=now,
                        updated_at=now,
                    )
                )
            token_set = TokenSet(tokens["access_token"], tokens["refresh_token"], expires_at)
            await reauth(db, "acme", token_set)
        finally:
            await db.dispose()

    asyncio.run(go())


def stored(url: str) -> tuple[TokenSet, str]:
    async def go() -> tuple[TokenSet, str]:
        db = open_database(url)
        try:
            async with db.begin() as conn:
                row = (
                    await conn.execute(select(connections).where(connections.c.tenant == "acme"))
                ).one()
            return TokenCipher.from_env().open(row.token_set), row.status
        finally:
            await db.dispose()

    return asyncio.run(go())


def call_once_more(url: str, server: OAuthTestServer) -> int:
    async def go() -> int:
        db = open_database(url)
        cfg = OAuth2Config(server.token_url, server.client_id, server.client_secret)
        try:
            async with httpx.AsyncClient(auth=OAuth2Auth(db, "acme", cfg)) as client:
                return (await client.get(server.resource_url)).status_code
        finally:
            await db.dispose()

    return asyncio.run(go())


def run_race(url: str, server: OAuthTestServer, tmp_path: Path) -> list[dict[str, object]]:
    env = {**os.environ, "OAUTH_APP_CLIENT_SECRET": server.client_secret}
    go = tmp_path / "go"
    procs = []
    for i in range(PROCESSES):
        # Output to files: a pipe nobody reads while waiting could fill and block the child.
        out = open(tmp_path / f"out-{i}.json", "wb")  # noqa: SIM115 - closed below
        err = open(tmp_path / f"err-{i}.txt", "wb")  # noqa: SIM115
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        str(APP),
                        "--database-url",
                        url,
                        "--tenant",
                        "acme",
                        "--token-url",
                        server.token_url,
                        "--client-id",
                        server.client_id,
                        "--resource-url",
                        server.resource_url,
                        "--tasks",
                        str(TASKS),
                        "--ready",
                        str(tmp_path / f"ready-{i}"),
                        "--go",
                        str(go),
                    ],
                    env=env,
                    stdout=out,
                    stderr=err,
                ),
                out,
                err,
            )
        )
    try:

        def ready() -> bool:
            assert all(p.poll() is None for p, _, _ in procs), "a race process died early"
            return all((tmp_path / f"ready-{i}").exists() for i in range(PROCESSES))

        wait_until(ready, "the race processes to get ready", interval=0.02)
        go.write_text("go")  # every process starts its jobs now
        for p, _, _ in procs:
            p.wait(PROCESS_TIMEOUT)
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()
    results: list[dict[str, object]] = []
    for i, (p, _, _) in enumerate(procs):
        stderr = (tmp_path / f"err-{i}.txt").read_text()
        assert p.returncode == 0, stderr
        results.extend(json.loads((tmp_path / f"out-{i}.json").read_text())["results"])
    return results


@pytest.mark.parametrize("how", ["expired_by_our_clock", "refused_with_401"])
def test_sixteen_jobs_in_four_processes_refresh_once(
    migrated_url: str, tmp_path: Path, how: str
) -> None:
    """One token request, no invalid_grant, every job succeeds; the rotation is kept."""
    with OAuthTestServer(token_latency=0.3, revoke_family_on_reuse=True) as server:
        tokens = server.issue_tokens("alice")
        server.expire_access_token(tokens["access_token"])
        now = datetime.now(UTC)
        # Either we know it expired (refresh ahead), or our clock thinks it valid and the
        # API's 401 says otherwise (refresh on 401, then retry).
        known = now - timedelta(minutes=1) if how == "expired_by_our_clock" else None
        seed(migrated_url, tokens, expires_at=known or now + timedelta(hours=1))

        results = run_race(migrated_url, server, tmp_path)

        assert results == [{"status": 200}] * (PROCESSES * TASKS)
        assert server.stats.token_requests == 1
        assert server.stats.invalid_grants == 0
        refused = server.stats.resource_unauthorized
        if how == "refused_with_401":
            # Jobs that read the token after the refresh committed never see a 401 (on
            # SQLite a read waits for the refresh's write lock); at least one must have.
            assert refused >= 1
        else:
            assert refused == 0
        assert server.stats.resource_requests == PROCESSES * TASKS + refused
        token_set, status = stored(migrated_url)
        assert status == "active"
        assert token_set.refresh_token != tokens["refresh_token"]
        # The stored refresh token is the live one: the next refresh works.
        server.expire_access_token(token_set.access_token)
        assert call_once_more(migrated_url, server) == 200
        assert server.stats.token_requests == 2 and server.stats.invalid_grants == 0

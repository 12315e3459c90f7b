"""`synckit sync` (issue 19 item 2) on both engines: ``--stream S`` runs that stream's
cycle only, and a cycle of a tenant whose breaker is open or which is paced waits in the
queue like a scheduled one: no request leaves before the resource allows it. The workers
are processes; `tenants add` and `sync` run in this process (tests/inprocess.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from inprocess import run_cli  # tests/
from loopback import LoopbackServer, Request  # tests/
from sqlalchemy import select, update
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT, stop  # tests/

from synckit.clock import utcnow
from synckit.runtime.http.pacing import defer_resource
from synckit.store.db import open_database
from synckit.store.tables import jobs, resources

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
CRM_APP = """
import os
from synckit import App, Connector, Page, Stream


class Crm(Connector):
    name = "crm"
    base_url = os.environ["CRM_API_URL"]
    streams = (Stream("contacts"), Stream("deals"))

    async def poll(self, ctx, checkpoint):
        body = (await ctx.http.get(f"/{ctx.stream}")).json()
        yield Page(body["items"], checkpoint={"read": len(body["items"])})

    async def handle(self, ctx, record):
        pass


app = App([Crm])
"""
HOLD = 4.0  # seconds the resource is held back
#: Once allowed, the cycle runs within this (generous: a busy machine's worker start-up,
#: on two shared cores, is counted in it); a hold that never lifts would exceed it.
RELEASE_BUDGET = 60.0


@pytest.fixture
def api() -> Iterator[LoopbackServer]:
    def respond(req: Request) -> tuple[int, dict[str, str], bytes]:
        body = json.dumps({"items": [{"id": f"{req.path.strip('/')}-1"}]}).encode()
        return 200, {"Content-Type": "application/json"}, body

    server = LoopbackServer(respond)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def workdir(tmp_path: Path, migrated_url: str, api: LoopbackServer) -> Path:
    (tmp_path / "crm_app.py").write_text(CRM_APP)
    added = cli(tmp_path, migrated_url, api, "tenants", "add", "acme", "crm")
    assert added.returncode == 0, added.stderr
    return tmp_path


def environment(url: str, api: LoopbackServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    return {
        **env,
        "SYNCKIT_SECRET_KEY": os.environ["SYNCKIT_SECRET_KEY"],
        "SYNCKIT_DATABASE_URL": url,
        "CRM_API_URL": api.url,
    }


def synckit(
    cwd: Path, url: str, api: LoopbackServer, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SYNCKIT, *args, "--app", "crm_app:app"], cwd=cwd, env=environment(url, api),
        # `sync --wait` waits up to its --timeout (EVENT_TIMEOUT below) by itself.
        capture_output=True, text=True, timeout=EVENT_TIMEOUT + PROCESS_TIMEOUT,
    )  # fmt: skip


def cli(
    workdir: Path, url: str, api: LoopbackServer, *args: str
) -> subprocess.CompletedProcess[str]:
    """:func:`synckit`, in this process: ``crm_app`` is imported afresh from ``workdir``
    (it reads the API's URL when imported)."""
    sys.path.insert(0, str(workdir))
    sys.modules.pop("crm_app", None)
    try:
        env = {"SYNCKIT_DATABASE_URL": url, "CRM_API_URL": api.url}
        return run_cli(*args, "--app", "crm_app:app", env=env)
    finally:
        sys.modules.pop("crm_app", None)
        sys.path.remove(str(workdir))


def paths(api: LoopbackServer) -> list[str]:
    return [r.path for r in api.requests]


def test_sync_stream_runs_that_stream_only(
    workdir: Path, migrated_url: str, api: LoopbackServer
) -> None:
    one = cli(workdir, migrated_url, api, "sync", "acme", "--stream", "deals", "--json")
    assert one.returncode == 0, one.stderr
    assert [c["stream"] for c in json.loads(one.stdout)["cycles"]] == ["deals"]
    burst = synckit(workdir, migrated_url, api, "worker", "--burst")
    assert burst.returncode == 0, burst.stderr
    assert json.loads(burst.stdout)["succeeded"] == 1
    assert paths(api) == ["/deals"]

    # Without --stream: every stream's cycle (so the test above could tell).
    every = cli(workdir, migrated_url, api, "sync", "acme", "--json")
    assert sorted(c["stream"] for c in json.loads(every.stdout)["cycles"]) == [
        "contacts",
        "deals",
    ]
    synckit(workdir, migrated_url, api, "worker", "--burst")
    # Without --stream every stream runs (a cycle may run again: cycles are at least once).
    assert set(paths(api)[1:]) == {"/contacts", "/deals"}


def _job(url: str, job_id: int) -> tuple[str | None, float | None]:
    """The job's resource key, and when it was last started (epoch)."""

    async def go() -> tuple[str | None, float | None]:
        db = open_database(url)
        try:
            async with db.read() as conn:
                row = (
                    await conn.execute(
                        select(jobs.c.resource_key, jobs.c.started_at).where(jobs.c.id == job_id)
                    )
                ).one()
            return row.resource_key, row.started_at.timestamp() if row.started_at else None
        finally:
            await db.dispose()

    return asyncio.run(go())


def _hold(url: str, how: str) -> float:
    """Hold the tenant's resource back for HOLD seconds; when it is allowed (epoch)."""

    async def go() -> float:
        db = open_database(url)
        try:
            now = utcnow()
            until = now + timedelta(seconds=HOLD)
            if how == "paced":
                await defer_resource(db, "crm:acme", until, "Retry-After", now=now)
            else:
                async with db.begin() as conn:
                    await conn.execute(
                        update(resources)
                        .where(resources.c.resource_key == "crm:acme")
                        .values(
                            state="open",
                            consecutive_failures=5,
                            opened_at=now,
                            cooldown_until=until,
                            updated_at=now,
                        )
                    )
            return until.timestamp()
        finally:
            await db.dispose()

    return asyncio.run(go())


@pytest.mark.parametrize("how", ["breaker open", "paced"])
def test_sync_of_a_held_tenant_sends_nothing_before_the_resource_allows(
    workdir: Path, migrated_url: str, api: LoopbackServer, how: str
) -> None:
    allowed = _hold(migrated_url, how)
    log = workdir / "worker.log"
    with open(log, "wb") as stderr:
        worker = subprocess.Popen(
            [*SYNCKIT, "worker", "--app", "crm_app:app", "--poll-interval", "0.1"],
            cwd=workdir, env=environment(migrated_url, api),
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        result = cli(
            workdir, migrated_url, api, "sync", "acme", "--stream", "deals", "--wait",
            "--json", "--timeout", str(int(EVENT_TIMEOUT)),
        )  # fmt: skip
    finally:
        stop(worker)
    assert result.returncode == 0, (result.stderr, log.read_text()[-3000:])
    [cycle] = json.loads(result.stdout)["cycles"]
    assert cycle["stream"] == "deals" and cycle["status"] == "succeeded", cycle
    # It waited in the queue, under the tenant's resource, not in a worker's slot.
    resource_key, started = _job(migrated_url, cycle["job_id"])
    assert resource_key == "crm:acme"
    assert started is not None and started >= allowed, (started, allowed)
    deals = [r.at for r in api.requests if r.path == "/deals"]
    assert deals, "the cycle sent no request"
    early = [round(allowed - at, 3) for at in api.times() if at < allowed]
    assert not early, f"requests sent {early} s before the resource allowed ({how})"
    assert min(deals) < allowed + RELEASE_BUDGET  # and it did run once allowed
    assert time.time() >= allowed

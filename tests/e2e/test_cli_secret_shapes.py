"""Every read command's output, on both engines: secrets in every
shape of ``secret_shapes.SHAPES`` (29), stored as they came (rows written before
redaction, or by a path that missed it), are printed by none of them (issue 16, done-when
1: "seeded secrets in 20+ shapes are found nowhere ... every CLI command's output").

The rows are written through the store and their text columns then overwritten raw, so
what is checked here is the commands' own redaction of what they read; that the storage
paths redact before writing is tests/integration/test_redaction_storage.py.

The commands run in process (tests/inprocess.py: the same command, its logging set up the
same way, without a Python start-up each); one of them runs as a real process too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

from inprocess import run_cli  # tests/
from secret_shapes import SHAPES
from sqlalchemy import insert, update
from waits import PROCESS_TIMEOUT  # tests/

from synckit.runtime.writes import outbox as outbox_store
from synckit.store.connections import insert_connection
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.jobs import enqueueing
from synckit.store.resources import configure_resource
from synckit.store.tables import checkpoints, connections, dead_letters, jobs, outbox, resources

NAMES = sorted(SHAPES)
SYNCKIT = [sys.executable, "-m", "synckit.cli"]


def secrets_by_shape() -> dict[str, str]:
    """A distinct token per shape: its first 10 characters are unique, so a secret shown
    cut short by a table column still counts as shown."""
    return {
        name: f"Zq{n:02d}{uuid.uuid4().hex[:8]}Kx{uuid.uuid4().hex[:10]}"
        for n, name in enumerate(NAMES)
    }


async def seed(db: Database, texts: dict[str, str]) -> dict[str, Any]:
    """Per shape: a job, a dead letter, a resource, a tenant (needs_reauth, its reason and
    a checkpoint's cursor) and a failed outbox message, each holding that shape's text;
    and one row of each holding every text, for the ``show`` commands."""
    now = datetime.now(UTC)
    everything = "\n".join(texts.values())
    keys = [*NAMES, "all"]
    text_of = {**{name: texts[name] for name in NAMES}, "all": everything}
    ids: dict[str, Any] = {"job": {}, "dl": {}}
    for n, key in enumerate(keys):
        text = text_of[key]
        tenant = f"t{n:02d}"
        job = await enqueueing.enqueue(
            db, "sync.things", {"tenant": tenant, "n": n}, resource_key=f"{tenant}:api"
        )
        ids["job"][key] = job.id
        await configure_resource(db, f"{tenant}:api")
        async with db.begin() as conn:
            await insert_connection(
                conn,
                tenant=tenant,
                connector="graph",
                resource_key=f"{tenant}:api",
                config={"region": "eu"},
                schedule="every 5m",
                now=now,
            )
            got = await dlq_capture.capture(
                conn,
                tenant=tenant,
                connector="graph",
                kind="record:users",
                record_id=f"u{n}",
                payload={"n": n},
                error_class="validation",
                message="placeholder",
                now=now,
            )
            ids["dl"][key] = got.id
            message_id = f"m{n}"
            await outbox_store.add(conn, "orders", {"n": n}, message_id=message_id)
            lines = list(texts.values()) if key == "all" else [text]
            # The texts, stored raw.
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job.id)
                .values(
                    status="dead",
                    last_error=text,
                    error_class="validation",
                    errors=[{"message": t, "traceback": t} for t in lines],
                )
            )
            await conn.execute(
                update(dead_letters)
                .where(dead_letters.c.id == got.id)
                .values(
                    error_message=text,
                    traceback=f"Traceback (most recent call last):\n{text}",
                    history=[
                        {
                            "at": now.isoformat(),
                            "source": "poll",
                            "error_class": "validation",
                            "message": t,
                            "attempt": 1,
                            "trace_id": None,
                        }
                        for t in lines
                    ],
                )
            )
            await conn.execute(
                update(resources)
                .where(resources.c.resource_key == f"{tenant}:api")
                .values(state="open", last_error=text, last_error_class="auth")
            )
            await conn.execute(
                update(connections)
                .where(connections.c.tenant == tenant)
                .values(status="needs_reauth", status_reason=text)
            )
            await conn.execute(
                insert(checkpoints).values(
                    tenant=tenant,
                    connector="graph",
                    stream="users",
                    cursor={"next": text},
                    updated_at=now,
                )
            )
            await conn.execute(
                update(outbox)
                .where(outbox.c.message_id == message_id)
                .values(status="failed", attempts=3, last_error=text)
            )
    ids["tenant_all"] = f"t{len(NAMES):02d}"
    return ids


def test_no_read_command_prints_a_secret_in_any_shape(migrated_url: str) -> None:
    """29 shapes seeded raw in every text column a command reads; each read command runs
    once as a process (wide terminal, so nothing is cut for width), exits 0, and its
    stdout and stderr hold no secret, nor the first 10 characters of one."""
    secrets = secrets_by_shape()
    texts = {name: SHAPES[name](secrets[name]) for name in NAMES}

    async def go() -> dict[str, Any]:
        db = open_database(migrated_url)
        try:
            return await seed(db, texts)
        finally:
            await db.dispose()

    ids = asyncio.run(go())
    job_all, dl_all, tenant_all = ids["job"]["all"], ids["dl"]["all"], ids["tenant_all"]
    commands = [
        ["jobs", "ls", "--limit", "100"],
        ["jobs", "ls", "--json", "--limit", "100"],
        ["jobs", "show", str(job_all)],
        ["dlq", "ls", "--limit", "0"],
        ["dlq", "ls", "--json"],
        ["dlq", "show", str(dl_all)],
        ["dlq", "show", str(dl_all), "--json"],
        ["dlq", "export", "-o", "-"],
        ["breakers", "ls"],
        ["breakers", "ls", "--json"],
        ["tenants", "ls", "--limit", "100"],
        ["tenants", "ls", "--json", "--limit", "100"],
        ["tenants", "show", tenant_all],
        ["status", "--limit", "100"],
        ["status", "--json", "--limit", "100"],
        ["outbox", "ls", "--limit", "100"],
        ["outbox", "ls", "--json", "--limit", "100"],
    ]
    results = [
        run_cli(*args, "--database-url", migrated_url, env={"COLUMNS": "2000"}) for args in commands
    ]
    as_process = ["status", "--json", "--limit", "100"]
    commands.append(as_process)
    results.append(
        subprocess.run(
            [*SYNCKIT, *as_process, "--database-url", migrated_url],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "2000"},
            timeout=PROCESS_TIMEOUT,
        )
    )
    leaks: dict[str, list[str]] = {}
    unmasked: list[str] = []
    for args, result in zip(commands, results, strict=True):
        assert result.returncode == 0, (args, result.stderr)
        shown = result.stdout + result.stderr
        if "***" not in shown:
            unmasked.append(" ".join(args))
        found = [name for name in NAMES if secrets[name][:10] in shown]
        if found:
            leaks[" ".join(args)] = found
    assert leaks == {}
    # The commands did read the seeded texts: each shows them masked.
    assert unmasked == []

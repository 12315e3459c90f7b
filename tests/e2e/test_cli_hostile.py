"""Hostile inputs to the read and write commands, on both engines: text that looks like
markup, secrets echoed by an API, numbers past the columns, impossible dates and URLs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from engines import sqlite_only  # tests/
from sqlalchemy import update
from waits import PROCESS_TIMEOUT  # tests/

from synckit.cli import cli
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.jobs import enqueueing
from synckit.store.resources import configure_resource
from synckit.store.tables import jobs as jobs_table
from synckit.store.tables import resources

T = TypeVar("T")
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = "SeCrEtKeY0123456789"
MARKUP = "Invalid path [/v1/users] [bold red]x[/bold red] [/]"
HOSTILE = f"{MARKUP} api_key={KEY} accessToken: {KEY}"


def with_db(url: str, make: Callable[[Database], Awaitable[T]]) -> T:
    async def go() -> T:
        db = open_database(url)
        try:
            return await make(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "400"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def seed(url: str) -> dict[str, int]:
    async def go(db: Database) -> dict[str, int]:
        job = await enqueueing.enqueue(db, "sync.things", {"tenant": "acme", "accessToken": KEY})
        async with db.begin() as conn:
            await conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job.id)
                .values(last_error=HOSTILE, errors=[{"message": HOSTILE}])
            )
            got = await dlq_capture.capture(
                conn,
                tenant="acme",
                connector="graph",
                kind="record:users",
                record_id="u[1]",
                payload={"clientSecret": KEY, "note": MARKUP},
                error_class="validation",
                message=HOSTILE,
                traceback=f"Traceback\n  {HOSTILE}\nValueError: [/v1/users] Bearer {KEY}",
                now=NOW,
            )
        await configure_resource(db, "acme:graph")
        async with db.begin() as conn:
            await conn.execute(
                update(resources)
                .where(resources.c.resource_key == "acme:graph")
                .values(last_error=HOSTILE)
            )
        return {"job": job.id, "dl": got.id}

    return with_db(url, go)


def test_read_commands_render_markup_literally_and_print_no_secret(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Invalid path [/v1/users]` is shown as it is (no MarkupError), and an API key the
    API echoed, in any shape, appears in no table, JSON, export or show output."""
    from rich.console import Console

    from synckit.cli import breakers, dlq, jobs, outbox, status, tenants

    wide = Console(width=400)  # every command module that prints tables
    for module in (breakers, dlq, jobs, outbox, status, tenants):
        monkeypatch.setattr(module, "console", wide)
    ids = seed(migrated_url)
    db = ["--database-url", migrated_url]
    outputs = {}
    for args in (
        ["dlq", "ls"],
        ["dlq", "ls", "--json"],
        ["dlq", "ls", "--group-by", "tenant,kind"],
        ["dlq", "show", str(ids["dl"])],
        ["dlq", "show", str(ids["dl"]), "--json"],
        ["dlq", "export", "-o", "-"],
        ["jobs", "ls"],
        ["jobs", "ls", "--json"],
        ["jobs", "show", str(ids["job"])],
        ["breakers", "ls"],
        ["breakers", "ls", "--json"],
    ):
        result = invoke(*args, *db)
        assert result.exit_code == 0, (args, result.output)
        assert KEY not in result.output, args
        outputs[" ".join(args)] = result.output
    assert "Invalid path [/v1/users]" in outputs["dlq show " + str(ids["dl"])]
    assert "[/v1/users]" in outputs["jobs ls"] and "[/v1/users]" in outputs["breakers ls"]
    assert "[bold red]x[/bold red]" in outputs["dlq ls"]
    exported = json.loads(outputs["dlq export -o -"].splitlines()[0])
    assert exported["payload"]["note"] == MARKUP and exported["payload"]["clientSecret"] == "***"


def test_dead_letter_texts_are_stored_redacted(migrated_url: str) -> None:
    """The capture stores message, history and traceback through the redaction step."""
    ids = seed(migrated_url)

    async def go(db: Database) -> Any:
        return await dlq_reads.get(db, ids["dl"])

    row = with_db(migrated_url, go)
    stored = json.dumps([row.error_message, row.history, row.traceback])
    assert KEY not in stored and "[/v1/users]" in stored


@sqlite_only
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["jobs", "show", str(2**70)], "2**70"),
        (["jobs", "priority", "1", str(2**70)], "2**70"),
        (["jobs", "enqueue", "k", "--priority", str(2**70)], "2**70"),
        (["jobs", "ls", "--since", "99999999999999d"], "longer than 100 years"),
        (["jobs", "enqueue", "k", "--in", "99999999999999d"], "longer than 100 years"),
        (["jobs", "reschedule", "1", "--at", "9999-12-31T23:59:59-14:00"], "outside"),
        (["jobs", "reschedule", "1", "--at", "0001-01-01T00:00:00+14:00"], "outside"),
        (["dlq", "show", str(2**70)], "2**70"),
        (["dlq", "purge", "--older-than", "99999999999999d"], "longer than 100 years"),
        (["worker", "--app", "x:y", "--metrics-port", "99999"], "99999"),
    ],
)
def test_out_of_range_arguments_are_one_line_errors(
    migrated_url: str, args: list[str], says: str
) -> None:
    """Numbers past the columns, durations past the calendar, impossible times: a usage
    error naming the value, exit 2, never a traceback or a database error."""
    result = invoke(*args, "--database-url", migrated_url)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    value = str(2**70) if says == "2**70" else says
    assert value in result.output, result.output


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("postgresql://u@127.0.0.1:99999/x", "port 99999"),
        ("not a url", "cannot read the URL"),
    ],
)
def test_bad_database_urls_are_refused_before_opening(tmp_path: Any, url: str, says: str) -> None:
    """`--database-url ""` does not silently create synckit.db; an impossible port or an
    unreadable URL is one line, nothing created."""
    result = subprocess.run(
        [sys.executable, "-m", "synckit.cli", "jobs", "ls", "--database-url", url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=PROCESS_TIMEOUT,
    )
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@sqlite_only
def test_app_names_a_function_it_is_never_called(tmp_path: Any, migrated_url: str) -> None:
    """`--app mod:func` refuses a function without calling it (json:dumps, or a function
    with side effects)."""
    (tmp_path / "sideeffect.py").write_text(
        "from pathlib import Path\ndef app():\n    Path('called').write_text('yes')\n"
    )
    for args in (
        ["worker", "--app", "sideeffect:app", "--burst"],
        ["worker", "--app", "json:dumps", "--burst"],
        ["dlq", "replay", "--all", "--app", "sideeffect:app"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "synckit.cli", *args, "--database-url", migrated_url],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=PROCESS_TIMEOUT,
        )
        assert result.returncode == 2, result.stderr
        assert "not called" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "called").exists()

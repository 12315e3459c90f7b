"""First contact with a database: a missing or outdated schema names `synckit db upgrade`,
and a read command creates nothing (SQLite makes no empty file)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from inprocess import run_cli  # tests/
from waits import PROCESS_TIMEOUT  # tests/

from synckit.store import migrate
from synckit.store.db import open_database, schema_revisions

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
READS = [("status",), ("jobs", "ls"), ("dlq", "ls"), ("tenants", "ls"), ("breakers", "ls")]


def synckit(cwd: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`synckit ARGS` as a process started in ``cwd`` with no ``SYNCKIT_`` setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
    return subprocess.run(
        [*SYNCKIT, *args, "--database-url", url],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )


def in_process(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process (tests/inprocess.py): same exit code and lines."""
    return run_cli(*args, "--database-url", url)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    return lines[0]


def test_the_shipped_revisions_end_at_alembics_head() -> None:
    assert schema_revisions()[-1] == migrate.head_revision()


def test_a_missing_database_or_schema_says_run_db_upgrade_and_creates_nothing(
    tmp_path: Path, db_url: str
) -> None:
    # The first as a user meets it, a process in an empty folder; the rest in process.
    for i, args in enumerate(READS):
        line = one_line(synckit(tmp_path, db_url, *args) if i == 0 else in_process(db_url, *args))
        assert "run `synckit db upgrade`" in line, (args, line)
        assert "no such table" not in line and "UndefinedTable" not in line
    if db_url.startswith("sqlite"):
        assert list(tmp_path.iterdir()) == []  # the file was not created
        assert "does not exist" in line
    else:
        assert "has no synckit schema" in line
    assert in_process(db_url, "db", "upgrade").returncode == 0
    ok = in_process(db_url, "jobs", "ls", "--json")
    assert ok.returncode == 0 and ok.stdout == "", ok.stderr


def test_an_outdated_schema_names_both_revisions(tmp_path: Path, db_url: str) -> None:
    older, head = schema_revisions()[-2:]

    async def go() -> None:
        db = open_database(db_url)
        try:
            await migrate.upgrade(db, older)
        finally:
            await db.dispose()

    asyncio.run(go())
    line = one_line(in_process(db_url, "jobs", "ls"))
    assert f"is at schema revision {older}, this synckit needs {head}" in line
    assert "run `synckit db upgrade`" in line

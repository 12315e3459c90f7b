"""`synckit db ...` run as a subprocess, on both engines, and its error cases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_cli  # tests/
from waits import PROCESS_TIMEOUT  # tests/

from synckit.store.db import schema_revisions

SYNCKIT = [sys.executable, "-m", "synckit.cli"]


def synckit(
    *args: str, env: dict[str, str] | None = None, as_nobody: bool = False
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if as_nobody else []
    return subprocess.run(
        [*prefix, *SYNCKIT, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=PROCESS_TIMEOUT,
    )


def test_db_upgrade_current_downgrade(db_url: str) -> None:
    """upgrade creates the schema, current reports head, downgrade base empties it.
    The first upgrade runs as the console script does, in a process of its own; the
    commands after it in this process (tests/inprocess.py), which shows the same exit
    codes and output without starting Python and Alembic four more times."""
    head = schema_revisions()[-1]
    up = synckit("db", "upgrade", "--database-url", db_url)
    assert up.returncode == 0, up.stderr
    assert f"at revision {head}" in up.stdout
    cur = run_cli("db", "current", "--database-url", db_url)
    assert cur.stdout.strip() == f"{head} (up to date)"
    again = run_cli("db", "upgrade", "--database-url", db_url)
    assert again.returncode == 0 and f"at revision {head}" in again.stdout
    down = run_cli("db", "downgrade", "base", "--database-url", db_url)
    assert down.returncode == 0, down.stderr
    assert run_cli("db", "current", "--database-url", db_url).stdout.startswith("base")


def test_default_url_is_sqlite_in_working_directory(tmp_path: Path) -> None:
    """Without a URL, synckit uses sqlite:///synckit.db in the working directory."""
    env = {k: v for k, v in os.environ.items() if k != "SYNCKIT_DATABASE_URL"}
    result = subprocess.run(
        [*SYNCKIT, "db", "upgrade"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=PROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "synckit.db").exists()


def test_url_from_environment(tmp_path: Path) -> None:
    """SYNCKIT_DATABASE_URL is used when --database-url is absent."""
    path = tmp_path / "env.db"
    result = synckit("db", "upgrade", env={"SYNCKIT_DATABASE_URL": f"sqlite:///{path}"})
    assert result.returncode == 0, result.stderr
    assert path.exists()


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_unusable_url_is_one_line_with_password_masked() -> None:
    """A URL synckit cannot use: one line, exit 2, password masked."""
    line = _one_line_error(synckit("db", "upgrade", "--database-url", "mysql://u:hunter2@h/db"))
    assert "unsupported database URL" in line
    assert "hunter2" not in line and "***" in line


def test_unreachable_server_is_one_line_with_password_masked() -> None:
    """An unreachable PostgreSQL server: one line, exit 2, password masked."""
    url = "postgresql://u:hunter2@127.0.0.1:9/db"
    line = _one_line_error(synckit("db", "current", "--database-url", url))
    assert "cannot reach database" in line
    assert "hunter2" not in line


@pytest.mark.parametrize(
    ("command", "url", "says"),
    [
        (["status"], "postgresql://u:hunter2@127.0.0.1:9/db", "cannot reach database"),
        (["tenants", "ls"], "postgresql://root@127.0.0.1/synckit_no_such_db", "does not exist"),
        (["jobs", "ls"], "postgresql://synckit_no_such_role@127.0.0.1/test", "does not exist"),
        (
            ["web", "--port", "9"],
            "postgresql://root@127.0.0.1/synckit_no_such_db",
            "does not exist",
        ),
    ],
    ids=["unreachable", "no-database", "no-role", "web"],
)
def test_every_command_reports_a_database_it_cannot_use_in_one_line(
    command: list[str], url: str, says: str
) -> None:
    """The schema check, every command's first connection (the console's too): an
    unreachable server, an unknown database or role is one line, never a traceback."""
    line = _one_line_error(synckit(*command, "--database-url", url))
    assert says in line and "hunter2" not in line


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_read_only_sqlite_path_is_one_line(tmp_path: Path) -> None:
    """A read-only SQLite file, and a path in a read-only directory: one line, exit 2."""
    as_nobody = os.geteuid() == 0  # root ignores permission bits
    db_file = tmp_path / "ro.db"
    assert synckit("db", "upgrade", "--database-url", f"sqlite:///{db_file}").returncode == 0
    for p in tmp_path.iterdir():
        p.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        line = _one_line_error(
            synckit("db", "upgrade", "--database-url", f"sqlite:///{db_file}", as_nobody=as_nobody)
        )
        assert "read-only" in line or "cannot open" in line
        line = _one_line_error(
            synckit(
                "db",
                "upgrade",
                "--database-url",
                f"sqlite:///{tmp_path}/new.db",
                as_nobody=as_nobody,
            )
        )
        assert "cannot open database" in line
    finally:
        tmp_path.chmod(0o755)

"""What a command's start imports: asyncpg is not imported for SQLite (~30 ms of every
``synckit`` command on SQLite)."""

from __future__ import annotations

import subprocess
import sys


def test_a_sqlite_command_does_not_import_asyncpg() -> None:
    probe = (
        "import sys\n"
        "import synckit.cli.dlq, synckit.cli.jobs, synckit.cli.status, synckit.store.db\n"
        "print('asyncpg' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""`synckit worker --app <App>` with no database on its command line uses the App's own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from waits import PROCESS_TIMEOUT  # tests/

from synckit.store.db import open_database
from synckit.store.jobs import admin, enqueueing

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parent.parent / "apps"


def test_worker_claims_from_the_apps_database_url_and_leaves_the_environment(
    migrated_url: str, tmp_path: Path
) -> None:
    """Without --database-url or $SYNCKIT_DATABASE_URL the worker claims from the App's
    database_url, not the default file, and sets no $SYNCKIT_DATABASE_URL (the job fails
    if it finds one)."""

    async def enqueue() -> int:
        db = open_database(migrated_url)
        try:
            return (await enqueueing.enqueue(db, "own_url.check", {})).id
        finally:
            await db.dispose()

    async def status(job_id: int) -> str:
        db = open_database(migrated_url)
        try:
            return (await admin.get_job(db, job_id)).status
        finally:
            await db.dispose()

    job_id = asyncio.run(enqueue())
    cwd = tmp_path / "cwd"  # not tmp_path: the SQLite test database may be a file there
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SYNCKIT_DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env["OWN_URL_APP_DATABASE"] = migrated_url
    result = subprocess.run(
        [*SYNCKIT, "worker", "--burst", "--app", "own_url_app:app"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=PROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    assert asyncio.run(status(job_id)) == "succeeded", result.stderr
    assert not (cwd / "synckit.db").exists()

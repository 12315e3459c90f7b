"""`synckit tenants import FILE` as a subprocess, on both engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

APPS = Path(__file__).parent.parent / "apps"
APP = "connector_app:app"


def tenants(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "synckit.cli", "tenants", *args, "--database-url", url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def ls(url: str) -> list[dict[str, Any]]:
    result = tenants(url, "ls", "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_import_adds_valid_files_and_names_bad_lines(migrated_url: str, tmp_path: Path) -> None:
    """A file with a bad line adds nothing and names the line; a good file adds all of it,
    with progress on stderr; --skip-invalid adds the valid rows of a bad file."""
    good = tmp_path / "good.jsonl"
    good.write_text(
        "".join(
            json.dumps({"tenant": f"t{i}", "config": {"api_token": f"k{i}"}}) + "\n"
            for i in range(30)
        )
    )
    bad = tmp_path / "bad.csv"
    bad.write_text("tenant,config.api_token\nx1,k\nx2,\n")
    refused = tenants(migrated_url, "import", str(bad), "--connector", "demo", "--app", APP)
    assert refused.returncode != 0
    assert "bad.csv:line 3:" in refused.stderr and "api_token" in refused.stderr
    assert "nothing added" in refused.stderr
    assert ls(migrated_url) == []
    done = tenants(migrated_url, "import", str(good), "--connector", "demo", "--app", APP)
    assert done.returncode == 0, done.stderr
    assert "added 30 tenants" in done.stdout and "30/30 tenants written" in done.stderr
    skipped = tenants(
        migrated_url, "import", str(bad), "--connector", "demo", "--app", APP, "--skip-invalid"
    )
    assert skipped.returncode == 1 and "added 1 tenants" in skipped.stdout
    assert len(ls(migrated_url)) == 31

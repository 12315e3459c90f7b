"""`synckit tenants import FILE`, in process (tests/inprocess.py), on both engines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from inprocess import run_cli  # tests/

APPS = Path(__file__).parent.parent / "apps"
APP = "connector_app:app"


def tenants(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    # In process (tests/inprocess.py), as wide as a pipe's default.
    return run_cli("tenants", *args, "--database-url", url, env={"COLUMNS": "80"})


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


def _row(tenant: str, **fields: Any) -> bytes:
    return json.dumps({"tenant": tenant, "config": {"api_token": "k"}, **fields}).encode() + b"\n"


def test_import_names_lines_that_are_not_text_or_hold_a_nul(
    migrated_url: str, tmp_path: Path
) -> None:
    """Hostile files: a line that is not UTF-8, a NUL in a key or in the config, a CSV
    header that is not UTF-8. Each is refused by its line, no traceback, and
    --skip-invalid adds the rest (a NUL reached PostgreSQL and failed the whole import;
    a byte that is not UTF-8 stopped the reading with a traceback)."""
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_bytes(
        _row("a")
        + b'{"tenant": "b\xff", "config": {"api_token": "k"}}\n'
        + _row("c", resource_key="r\u0000")
        + json.dumps({"tenant": "d", "config": {"api_token": "k\u0000"}}).encode()
        + b"\n"
        + _row("e")
    )
    args = ("--connector", "demo", "--app", APP, "--skip-invalid")
    got = tenants(migrated_url, "import", str(hostile), *args)
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert "hostile.jsonl:line 2: not UTF-8 text" in got.stderr
    assert "hostile.jsonl:line 3: resource key 'r\\x00' holds a control character" in got.stderr
    assert "hostile.jsonl:line 4: config of tenant 'd': api_token holds a NUL" in got.stderr
    assert "added 2 tenants" in got.stdout
    hostile_csv = tmp_path / "hostile.csv"
    hostile_csv.write_bytes(b"tenant,config.api_token\nf,k\ng\xff,k\nh,k\n")
    got = tenants(migrated_url, "import", str(hostile_csv), *args)
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert "hostile.csv:line 3: not UTF-8 text" in got.stderr and "added 2 tenants" in got.stdout
    header = tmp_path / "header.csv"
    header.write_bytes(b"ten\xffant,config.api_token\ni,k\n")
    got = tenants(migrated_url, "import", str(header), *args)
    assert "header.csv:line 1: the header is not UTF-8 text" in got.stderr, got.stderr
    assert sorted(t["tenant"] for t in ls(migrated_url)) == ["a", "e", "f", "h"]

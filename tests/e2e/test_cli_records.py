"""`synckit db upgrade --app` owns the records tables; `synckit records ...` reads them.

On both engines: tables created once even by two upgrade processes at once; a new
optional field added as a column and an incompatible change refused in one line naming
field and table (the upgrades run in process: tests/inprocess.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from inprocess import run_cli  # tests/
from sqlalchemy import text

from synckit.store.db import open_database

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parents[1] / "apps"


def columns(url: str, table: str) -> list[str]:
    async def read() -> list[str]:
        d = open_database(url)
        try:
            async with d.read() as conn:
                if d.is_postgres:
                    rows = await conn.execute(
                        text(
                            "SELECT column_name FROM information_schema.columns"
                            " WHERE table_name = :t AND table_schema = current_schema()"
                        ),
                        {"t": table},
                    )
                else:
                    rows = await conn.execute(
                        text(f"SELECT name FROM pragma_table_info('{table}')")
                    )
                return sorted(str(r[0]) for r in rows)
        finally:
            await d.dispose()

    return asyncio.run(read())


async def _poll(url: str, api_url: str) -> None:
    import records_app

    records_app.Shop.base_url = api_url
    d = open_database(url)
    try:
        await records_app.App([records_app.Shop]).poll(d, "acme", "orders")
    finally:
        await d.dispose()


def upgrade(url: str, variant: str = "") -> subprocess.CompletedProcess[str]:
    """`synckit db upgrade --app records_app:app`, in this process, with the app's model as
    ``variant`` declares it (read when the app's module is imported: imported afresh)."""
    if str(APPS) not in sys.path:
        sys.path.insert(0, str(APPS))
    sys.modules.pop("records_app", None)
    try:
        return run_cli(
            "db", "upgrade", "--app", "records_app:app", "--database-url", url,
            env={"RECORDS_APP_VARIANT": variant},
        )  # fmt: skip
    finally:
        sys.modules.pop("records_app", None)


def test_two_upgrades_at_once_create_the_tables_once(db_url: str) -> None:
    """Two `db upgrade --app` processes started together: both succeed, the tables exist
    once, and exactly one of them says it created them."""
    env = {**os.environ, "PYTHONPATH": str(APPS), "RECORDS_APP_VARIANT": ""}
    cmd = [*SYNCKIT, "db", "upgrade", "--app", "records_app:app", "--database-url", db_url]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    created = [o for o, _ in outs if "created table orders" in o]
    assert len(created) == 1, outs
    assert "created table order_lines" in created[0]
    assert "_seq" in columns(db_url, "orders")


def test_a_new_optional_field_adds_a_column_and_incompatible_changes_are_refused(
    db_url: str,
) -> None:
    assert upgrade(db_url).returncode == 0
    added = upgrade(db_url, "optional")
    assert added.returncode == 0, added.stderr
    assert "table orders: added gift" in added.stdout
    assert "gift" in columns(db_url, "orders")
    assert upgrade(db_url, "optional").stdout.count("added") == 0  # nothing left to do

    for variant, field, what in (
        ("type", "total", "changed type (float -> text)"),
        ("required", "region", "is required"),
    ):
        refused = upgrade(db_url, variant)
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert f"'{field}'" in lines[0] and "'orders'" in lines[0] and what in lines[0], lines
        assert "Traceback" not in refused.stderr


def test_records_ls_show_and_changes_read_the_table(db_url: str, tmp_path: Path) -> None:
    """After a sync, `records ls/show/changes` print the rows and the change feed, paged
    by the cursor `changes --json` gives back. The upgrade runs as a process; the
    commands that print run in this process (tests/inprocess.py: same exit code and
    output, without a Python start-up each)."""
    sys.path.insert(0, str(APPS))
    from records_app import OrdersApi, order

    api = OrdersApi()
    try:
        assert upgrade(db_url).returncode == 0
        env = {"RECORDS_APP_URL": api.url}
        assert run_cli(
            "tenants", "add", "acme", "shop", "--app", "records_app:app",
            "--database-url", db_url, env=env,
        ).returncode == 0  # fmt: skip
        api.data["acme"] = [order(i) for i in range(5)]
        asyncio.run(_poll(db_url, api.url))
        app = ["--app", "records_app:app", "--database-url", db_url]
        ls = run_cli("records", "ls", "acme", "orders", *app, "--json")
        assert ls.returncode == 0, ls.stderr
        assert [json.loads(line)["id"] for line in ls.stdout.splitlines()] == [
            f"o{i:06d}" for i in range(5)
        ]
        show = run_cli("records", "show", "acme", "orders", "o000003", *app, "--json")
        assert json.loads(show.stdout)["customer"] == "c3"
        first = run_cli("records", "changes", "acme", "orders", "--limit", "3", *app, "--json")
        page = json.loads(first.stdout)
        assert [c["op"] for c in page["changes"]] == ["added"] * 3 and page["more"]
        rest = run_cli(
            "records", "changes", "acme", "orders", "--since", str(page["cursor"]), *app, "--json"
        )
        page2 = json.loads(rest.stdout)
        assert [c["key"] for c in page2["changes"]] == [["o000003"], ["o000004"]]
        assert not page2["more"]
    finally:
        api.close()

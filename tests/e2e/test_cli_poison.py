"""Corrupt rows and hostile config files against the CLI, on both engines: read commands
show what they cannot read as such and exit 0; a config file that cannot be read is one
line, exit 2, nothing added. The commands run in process (tests/inprocess.py, an escaped
exception shown as its traceback); `status` also as processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner
from engines import sqlite_only  # tests/
from inprocess import run_cli  # tests/
from sqlalchemy import func, select, update
from waits import PROCESS_TIMEOUT  # tests/

from synckit.cli import cli
from synckit.store.db import Database, open_database
from synckit.store.tables import checkpoints, connections, resources

T = TypeVar("T")
APPS = Path(__file__).parent.parent / "apps"
APP = "connector_app:app"
SOON = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def with_db(url: str, make: Callable[[Database], Awaitable[T]]) -> T:
    async def go() -> T:
        db = open_database(url)
        try:
            return await make(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


def run_all(
    commands: list[list[str]], *, process: bool = False
) -> list[subprocess.CompletedProcess[str]]:
    """Each ``synckit`` command in process, one after the other; or each as its own
    process, all started at once."""
    if not process:
        return [run_cli(*args, env={"COLUMNS": "250"}) for args in commands]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "250",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "synckit.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for args in commands
    ]
    out = []
    for args, p in zip(commands, procs, strict=True):
        stdout, stderr = p.communicate(timeout=PROCESS_TIMEOUT)
        out.append(subprocess.CompletedProcess(args, p.returncode, stdout, stderr))
    return out


async def seed_tenants(db: Database) -> None:
    from connector_app import app

    for name in ("acme", "globex", "initech", "umbrella"):
        await app.add_tenant(db, name, "demo", {"api_token": f"tok-{name}-123456"})


def poison(url: str, engine_name: str) -> None:
    """globex's breaker in a state nobody writes, initech's connection in a status
    nobody writes, umbrella paced until SOON (a good row), and on SQLite, where a
    timestamp column takes any text, acme's next_available_at is 'garbage'."""

    async def go(db: Database) -> None:
        await seed_tenants(db)
        async with db.begin() as conn:
            r, c = resources.c, connections.c
            await conn.execute(
                update(resources).where(r.resource_key == "demo:globex").values(state="weird")
            )
            await conn.execute(
                update(connections).where(c.tenant == "initech").values(status="zombie")
            )
            await conn.execute(
                update(resources)
                .where(r.resource_key == "demo:umbrella")
                .values(next_available_at=SOON)
            )
            if engine_name == "sqlite":
                await conn.exec_driver_sql(
                    "UPDATE resources SET next_available_at = 'garbage'"
                    " WHERE resource_key = 'demo:acme'"
                )

    with_db(url, go)


def test_read_commands_show_corrupt_rows_marked_and_exit_0(
    migrated_url: str, engine_name: str
) -> None:
    """breakers ls, status and tenants ls (table and --json) on a garbage timestamp, an
    unknown breaker state and an unknown connection status: exit 0, no traceback, the
    bad values marked (unknown / <unreadable>), good rows as before."""
    poison(migrated_url, engine_name)
    db = ["--database-url", migrated_url]
    commands = [
        ["breakers", "ls", *db],
        ["breakers", "ls", "--json", *db],
        ["status", *db],
        ["status", "--json", *db],
        ["tenants", "ls", *db],
        ["tenants", "ls", "--json", *db],
    ]
    results = run_all(commands)
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    b_table, b_json, s_table, s_json, t_table, t_json = (r.stdout for r in results)
    garbage = engine_name == "sqlite"

    breakers = {d["resource_key"]: d for d in map(json.loads, b_json.splitlines())}
    assert breakers["demo:globex"]["state"] == "weird"
    assert breakers["demo:globex"]["unreadable"] == {"state": "unknown state 'weird'"}
    assert breakers["demo:umbrella"]["next_available_at"] == SOON.isoformat()
    assert "unreadable" not in breakers["demo:umbrella"]
    assert "weird (unknown)" in b_table and "2031-05-06T07:08:09" in b_table
    if garbage:
        assert breakers["demo:acme"]["next_available_at"] is None
        assert breakers["demo:acme"]["unreadable"] == {
            "next_available_at": "a timestamp out of range"
        }
        assert "<unreadable>" in b_table

    status = {t["tenant"]: t for t in json.loads(s_json)["tenants"]}
    assert status["initech"]["unreadable"] == {"status": "unknown status 'zombie'"}
    assert status["globex"]["unreadable"] == {"breaker": "unknown state 'weird'"}
    assert status["umbrella"]["next_available_at"] == SOON.isoformat()
    assert "unreadable" not in status["umbrella"]
    assert "zombie (unknown)" in s_table and "weird (unknown)" in s_table
    if garbage:
        # Guarded in SQL as jobs ls reads run_at: on SQLite 'garbage' sorts past any time.
        assert status["acme"]["unreadable"] == {"next_available_at": "a timestamp out of range"}
        assert "<unreadable>" in s_table

    tenants = {t["tenant"]: t for t in map(json.loads, t_json.splitlines())}
    assert tenants["initech"]["status"] == "zombie"
    assert tenants["initech"]["unreadable"] == {"status": "unknown status 'zombie'"}
    assert "unreadable" not in tenants["acme"] and tenants["acme"]["created_at"]
    assert "zombie (unknown)" in t_table and "active (unknown)" not in t_table


def test_tenants_ls_and_show_survive_a_garbage_created_at(migrated_url: str) -> None:
    """SQLite keeps any text in a timestamp column: tenants ls/show list that tenant with
    created_at unreadable (null, named) and the others as they are; exit 0."""
    if not migrated_url.startswith("sqlite"):
        # timestamptz refuses such a value; the column cannot hold one.
        return

    async def go(db: Database) -> None:
        await seed_tenants(db)
        async with db.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE connections SET created_at = 'yesterday-ish' WHERE tenant = 'globex'"
            )

    with_db(migrated_url, go)
    runner = CliRunner()
    ls = runner.invoke(cli, ["tenants", "ls", "--json", "--database-url", migrated_url])
    show = runner.invoke(cli, ["tenants", "show", "globex", "--database-url", migrated_url])
    table = runner.invoke(cli, ["tenants", "ls", "--database-url", migrated_url])
    assert (ls.exit_code, show.exit_code, table.exit_code) == (0, 0, 0), ls.output + show.output
    rows = {t["tenant"]: t for t in map(json.loads, ls.output.splitlines())}
    assert len(rows) == 4 and rows["acme"]["created_at"] is not None
    assert rows["globex"]["created_at"] is None
    assert rows["globex"]["unreadable"] == {"created_at": "a timestamp out of range"}
    assert json.loads(show.output)["unreadable"] == rows["globex"]["unreadable"]
    assert "globex" in table.output


@sqlite_only
def test_config_files_that_cannot_be_read_are_one_line_errors(
    migrated_url: str, tmp_path: Path
) -> None:
    """tenants add --config-file: not UTF-8, nested 100,000 deep, larger than 10 MiB, a
    JSON array, missing; and --config/--set nested too deeply: each one line on stderr
    naming the problem, exit 2, no traceback, no tenant added."""
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b'{"api_token": "caf\xe9"}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(11 * 1024 * 1024)
    array = tmp_path / "array.json"
    array.write_text('[{"api_token": "x"}]')
    cases = [
        (["--config-file", str(latin)], "is not UTF-8 (byte 18)"),
        (["--config-file", str(deep)], "is nested too deeply"),
        (["--config-file", str(big)], "is larger than 10 MiB"),
        (["--config-file", str(array)], "config must be a JSON object, not list"),
        (["--config-file", str(tmp_path / "nope.json")], "cannot read --config-file"),
        (["--config", "[" * 50_000], "--config is nested too deeply"),
        (["--set", "page_size=" + "[" * 30_000 + "]" * 30_000], "--set page_size is nested"),
    ]
    db = ["--database-url", migrated_url, "--app", APP]
    results = run_all([["tenants", "add", "t1", "demo", *args, *db] for args, _ in cases])
    for (args, says), r in zip(cases, results, strict=True):
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (args[0], r.stderr[-500:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (args[0], r.stderr[-500:])
        assert says in lines[0], (says, lines[0])

    async def count(db: Database) -> int:
        async with db.begin() as conn:
            return int(
                (await conn.execute(select(func.count()).select_from(connections))).scalar_one()
            )

    assert with_db(migrated_url, count) == 0


def test_good_timestamps_read_the_same_through_the_text_path(migrated_url: str) -> None:
    """The corrupt-row-proof read gives back what was written on either engine (the
    driver's datetime on PostgreSQL, ISO text on SQLite): umbrella paced until SOON."""
    from synckit.store.resources import get_resource

    async def go(db: Database) -> Any:
        await seed_tenants(db)
        async with db.begin() as conn:
            await conn.execute(
                update(resources)
                .where(resources.c.resource_key == "demo:umbrella")
                .values(next_available_at=SOON, cooldown_until=SOON + timedelta(seconds=1))
            )
        return await get_resource(db, "demo:umbrella")

    info = with_db(migrated_url, go)
    assert info.next_available_at == SOON and info.next_available_at.tzinfo is not None
    assert info.cooldown_until == SOON + timedelta(seconds=1)
    assert info.unreadable == ()


# --- one corrupt value of each kind, per command family ----------------------------------

#: A timestamp no reader takes: SQLite keeps any text, PostgreSQL a year no datetime holds.
BAD_TIME = {"sqlite": "'garbage'", "postgresql": "'20000-01-01'::timestamptz"}
#: JSON no reader takes: SQLite keeps any text; JSONB holds only JSON, but a number of
#: 5,000 digits is past what Python's json reads.
BAD_JSON = {"sqlite": "'{not json'", "postgresql": "('1' || repeat('0', 5000))::jsonb"}
ARRAY = {"sqlite": "'[1, 2]'", "postgresql": "'[1, 2]'::jsonb"}
FIVE = ("acme", "globex", "hooli", "initech", "umbrella")


def corrupt(url: str, engine_name: str, statements: list[str]) -> None:
    """Run ``statements`` (``{time}``, ``{json}`` and ``{array}`` standing for this
    engine's corrupt values) after the five tenants are added, each with a checkpoint."""

    async def go(db: Database) -> None:
        from connector_app import app

        for name in FIVE:
            await app.add_tenant(db, name, "demo", {"api_token": f"tok-{name}-123456"})
        async with db.begin() as conn:
            for name in FIVE:
                await conn.execute(
                    checkpoints.insert().values(
                        tenant=name,
                        connector="demo",
                        stream="items",
                        cursor={"page": 3},
                        updated_at=SOON,
                    )
                )
            for sql in statements:
                await conn.exec_driver_sql(
                    sql.format(
                        time=BAD_TIME[engine_name],
                        json=BAD_JSON[engine_name],
                        array=ARRAY[engine_name],
                    )
                )

    with_db(url, go)


def test_status_names_each_corrupt_row_and_the_jobs_that_never_run(
    migrated_url: str, engine_name: str
) -> None:
    """`status` (table, --json, a page, --all) on a created_at, a checkpoint time and a
    poll job's finish time that are not timestamps, a config that is not JSON, a
    JSON-array config, an unknown status, an alert whose details are not JSON and a pending
    job whose run_at cannot be read: exit 0; each value named per tenant; the job counted,
    named and alerted on."""

    async def jobs_(db: Database) -> tuple[int, int]:
        from synckit.clock import utcnow
        from synckit.store.jobs import enqueueing
        from synckit.store.jobs.enqueueing import JobSpec
        from synckit.store.tables import alerts

        stuck, done = await enqueueing.enqueue_many(
            db,
            [JobSpec("sync.things"), JobSpec("synckit.poll", resource_key="demo:globex")],
        )
        # A recent alert as the worker records it; its details are corrupted below.
        now = utcnow()
        async with db.begin() as conn:
            await conn.execute(
                alerts.insert().values(
                    dedupe_key="dead_cycles|tenant:acme|w",
                    rule="dead_cycles",
                    subject="tenant:acme",
                    window_key="w",
                    severity="critical",
                    tenant="acme",
                    connector="demo",
                    message="5 dead cycles",
                    details={},
                    fired_at=now,
                    recorded_at=now,
                    delivered={},
                )
            )
        return stuck.id, done.id

    stuck, done = with_db(migrated_url, jobs_)
    corrupt(
        migrated_url,
        engine_name,
        [
            "UPDATE connections SET created_at = {time} WHERE tenant = 'acme'",
            "UPDATE checkpoints SET updated_at = {time} WHERE tenant = 'globex'",
            f"UPDATE jobs SET status = 'succeeded', finished_at = {{time}} WHERE id = {done}",
            "UPDATE connections SET config = {json}, status = 'zombie' WHERE tenant = 'initech'",
            "UPDATE connections SET config = {array} WHERE tenant = 'umbrella'",
            "UPDATE alerts SET details = {json} WHERE rule = 'dead_cycles'",
            f"UPDATE jobs SET run_at = {{time}} WHERE id = {stuck}",
        ],
    )
    db = ["--database-url", migrated_url]
    results = run_all(
        [
            ["status", *db],
            ["status", "--json", *db],
            ["status", "--json", "--limit", "2", "--after", "acme", *db],
            ["status", "--json", "--all", *db],
        ]
    )
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    table, whole, page, every = (r.stdout for r in results)
    for shown in (json.loads(whole), json.loads(every)):
        tenants = {t["tenant"]: t for t in shown["tenants"]}
        assert tenants["acme"]["unreadable"] == {"created_at": "a timestamp out of range"}
        assert tenants["globex"]["unreadable"] == {"last_success_at": "a timestamp out of range"}
        assert tenants["globex"]["last_success_at"] is None
        assert tenants["initech"]["unreadable"] == {"status": "unknown status 'zombie'"}
        assert "unreadable" not in tenants["umbrella"] and "unreadable" not in tenants["hooli"]
        assert shown["unreadable_jobs"] == 1 and [j["id"] for j in shown["stuck_jobs"]] == [stuck]
        firing = [a for a in shown["alerts_firing"] if a["rule"] == "unreadable_run_at"]
        assert [a["subject"] for a in firing] == [f"job:{stuck}"]
        assert shown["alerts_recent"] == []  # the alert that cannot be read is passed over
    assert [t["tenant"] for t in json.loads(page)["tenants"]] == ["globex", "hooli"]
    assert "unreadable in tenant acme: created_at (a timestamp out of range)" in table
    assert "unreadable in tenant globex: last_success_at" in table
    assert "zombie (unknown)" in table
    assert "1 pending job(s) never run" in table and f"ids {stuck})" in table
    assert f"job {stuck} (sync.things) never runs" in table


def test_tenants_ls_and_show_read_each_corrupt_row(migrated_url: str, engine_name: str) -> None:
    """`tenants ls` (table, --json, a page) and `tenants show` on a created_at and an
    updated_at that are not timestamps, a config that is not JSON, a JSON-array config,
    an unknown status, a checkpoint cursor that is not JSON and a checkpoint time that
    is not one: exit 0, each unreadable value null and named with a one-line reason."""
    corrupt(
        migrated_url,
        engine_name,
        [
            "UPDATE connections SET created_at = {time} WHERE tenant = 'acme'",
            "UPDATE checkpoints SET cursor = {json} WHERE tenant = 'acme'",
            "UPDATE connections SET updated_at = {time} WHERE tenant = 'globex'",
            "UPDATE checkpoints SET updated_at = {time} WHERE tenant = 'globex'",
            "UPDATE connections SET status = 'zombie' WHERE tenant = 'hooli'",
            "UPDATE connections SET config = {json} WHERE tenant = 'initech'",
            "UPDATE connections SET config = {array} WHERE tenant = 'umbrella'",
        ],
    )
    db = ["--database-url", migrated_url]
    results = run_all(
        [
            ["tenants", "ls", *db],
            ["tenants", "ls", "--json", *db],
            ["tenants", "ls", "--json", "--limit", "2", "--after", "acme", *db],
            *(["tenants", "show", name, *db] for name in FIVE),
        ]
    )
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    table, listed, page, *shows = (r.stdout for r in results)
    rows = {t["tenant"]: t for t in map(json.loads, listed.splitlines())}
    assert sorted(rows) == list(FIVE)
    assert rows["acme"]["created_at"] is None
    assert rows["acme"]["unreadable"] == {"created_at": "a timestamp out of range"}
    assert rows["globex"]["unreadable"] == {"updated_at": "a timestamp out of range"}
    assert rows["hooli"]["unreadable"] == {"status": "unknown status 'zombie'"}
    assert rows["initech"]["config"] == "<unreadable: the stored config is not JSON>"
    assert rows["umbrella"]["config"].startswith("<unreadable: ")
    assert [t["tenant"] for t in map(json.loads, page.splitlines())] == ["globex", "hooli"]
    assert "2 of 5 tenants; next page: --after hooli" in results[2].stderr
    assert "Tenants: 5 (4 active, 1 zombie (unknown))" in table
    assert "unreadable in tenant initech: config (the stored config is not JSON)" in table
    shown = dict(zip(FIVE, map(json.loads, shows), strict=True))
    acme = shown["acme"]["checkpoints"]["items"]
    assert acme["cursor"] is None and set(acme["unreadable"]) == {"cursor"}
    says = "not JSON: " if engine_name == "sqlite" else "cannot be read: Exceeds the limit"
    assert acme["unreadable"]["cursor"].startswith(says), acme
    assert shown["acme"]["unreadable"] == {"created_at": "a timestamp out of range"}
    globex = shown["globex"]["checkpoints"]["items"]
    assert globex == {
        "cursor": {"page": 3},
        "updated_at": None,
        "unreadable": {"updated_at": "a timestamp out of range"},
    }
    assert shown["hooli"]["checkpoints"]["items"] == {
        "cursor": {"page": 3},
        "updated_at": SOON.isoformat(),
    }
    assert shown["initech"]["config"] == "<unreadable: the stored config is not JSON>"


def test_status_reads_past_audit_buckets_that_cannot_be_read(
    migrated_url: str, engine_name: str
) -> None:
    """`status` (table, --json) while one audit bucket's class counts are no JSON a
    reader takes and another's minute is a timestamp no datetime holds: exit 0; the
    alert rules run on the sound buckets (6 server errors of acme fire, the unreadable
    bucket's 100 are not counted)."""
    just_now = datetime.now(UTC) - timedelta(minutes=2)

    async def go(db: Database) -> None:
        from audit_rows import record_audit  # tests/

        await seed_tenants(db)
        async with db.begin() as conn:
            for tenant, errors in (("acme", 6), ("globex", 100), ("initech", 100)):
                await record_audit(
                    conn, tenant, "demo", just_now, 10, {"server_error": errors}, app_version="v1"
                )
            bad = {"json": BAD_JSON[engine_name], "time": BAD_TIME[engine_name]}
            for tenant, sets in (
                ("globex", "failed_by_class = {json}"),
                ("initech", "minute = {time}"),
            ):
                await conn.exec_driver_sql(
                    f"UPDATE audit_buckets SET {sets.format(**bad)} WHERE tenant = '{tenant}'"
                )

    with_db(migrated_url, go)
    db = ["--database-url", migrated_url]
    results = run_all([["status", *db], ["status", "--json", *db]], process=True)
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    table, as_json = (r.stdout for r in results)
    shown = json.loads(as_json)
    assert shown["alerts_evaluated"] is True
    bursts = [a for a in shown["alerts_firing"] if a["rule"] == "server_errors"]
    assert [(a["subject"], a["details"]["count"]) for a in bursts] == [("demo", 6)]
    assert "6 server errors" in table

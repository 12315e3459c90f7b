"""`synckit status` (in process, tests/inprocess.py) and `synckit worker --metrics-port` (a
process), on both engines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from audit_rows import record_audit  # tests/
from inprocess import run_cli  # tests/
from sqlalchemy import insert, update
from waits import PROCESS_TIMEOUT, wait_until  # tests/

from synckit.runtime.observe.alert_delivery import AlertRouter
from synckit.runtime.observe.alert_rules import dlq_review_alert
from synckit.store.audit import read_audit
from synckit.store.db import open_database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import checkpoints, connections, dead_letters, resources

SYNCKIT = [sys.executable, "-m", "synckit.cli"]


def synckit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # In process (tests/inprocess.py); the worker below is a process.
    return run_cli(*args, env={"COLUMNS": "250", **(env or {})})


async def _seed(url: str) -> None:
    now = datetime.now(UTC)
    db = open_database(url)
    try:
        async with db.begin() as conn:
            for tenant, status, reason in (
                ("acme", "active", None),
                ("beta", "needs_reauth", "invalid_grant"),
            ):
                await conn.execute(
                    insert(connections).values(
                        tenant=tenant,
                        connector="graph",
                        resource_key=f"graph:{tenant}",
                        schedule="every 5m",
                        status=status,
                        status_reason=reason,
                        created_at=now - timedelta(days=3),
                        updated_at=now - timedelta(days=3),
                    )
                )
            await conn.execute(
                insert(checkpoints).values(
                    tenant="acme",
                    connector="graph",
                    stream="messages",
                    cursor={"delta": "x"},
                    updated_at=now - timedelta(minutes=2),
                )
            )
            # acme: 7 failures in 1,000 (a burn of 140%, watch).
            await record_audit(
                conn, "acme", "graph", now - timedelta(hours=2), 993, {"validation": 7}
            )
            await conn.execute(
                insert(dead_letters),
                [
                    {
                        "tenant": "acme",
                        "connector": "graph",
                        "kind": "record:messages",
                        "record_id": f"m{i}",
                        "error_class": "validation",
                        "error_message": "missing subject",
                        "status": "review" if i == 0 else "pending",
                        "first_failed_at": now,
                        "last_attempt_at": now,
                    }
                    for i in range(3)
                ],
            )
        await enqueueing.enqueue_many(
            db,
            [JobSpec("synckit.poll", {"tenant": "acme"}, resource_key="graph:acme")]
            + [JobSpec("send_mail", {"n": i}) for i in range(2)],
        )
        await enqueueing.enqueue(db, "synckit.poll", {"tenant": "beta"}, resource_key="graph:beta")
        async with db.begin() as conn:
            await conn.execute(
                update(resources)
                .where(resources.c.resource_key == "graph:beta")
                .values(state="open", next_available_at=now + timedelta(minutes=10))
            )
        router = AlertRouter(db=db, log_sink=False)
        await router.emit(dlq_review_alert("acme", "validation", 1, now=now, connector="graph"))
    finally:
        await db.dispose()


def test_status_as_json_on_a_seeded_database(migrated_url: str) -> None:
    """--json reports each tenant's breaker, lag, budget and DLQ, queue depth and alerts."""
    asyncio.run(_seed(migrated_url))
    result = synckit("status", "--json", "--database-url", migrated_url)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    tenants = {t["tenant"]: t for t in data["tenants"]}
    acme, beta = tenants["acme"], tenants["beta"]
    assert (acme["status"], acme["breaker"]) == ("active", "closed")
    assert 100 <= acme["lag_seconds"] < 300
    assert acme["last_success_at"] is not None
    assert (acme["ok"], acme["failed"]) == (993, 7)
    assert acme["budget_burn"] == 1.4 and acme["budget_level"] == "watch"
    assert (acme["dlq_pending"], acme["dlq_review"]) == (2, 1)
    assert (beta["status"], beta["status_reason"], beta["breaker"]) == (
        "needs_reauth",
        "invalid_grant",
        "open",
    )
    assert beta["next_available_at"] is not None and beta["lag_seconds"] is None
    # What holds each tenant's jobs, as the claim's gate decides.
    assert (acme["held_by"], acme["held_until"]) == (None, None)
    assert (beta["held_by"], beta["held_until"]) == ("breaker", beta["next_available_at"])
    assert data["queue"] == {"synckit.poll": {"pending": 2}, "send_mail": {"pending": 2}}
    assert data["dead_letters"] == {"pending": 2, "review": 1}
    firing = {(a["rule"], a["subject"]) for a in data["alerts_firing"]}
    assert ("needs_reauth", "beta") in firing
    # acme polled two minutes ago; beta waits for re-auth, which is its own alert.
    assert not {r for r, _ in firing} & {"poll_lag", "tenant_outlier", "server_errors"}
    assert [(a["rule"], a["subject"]) for a in data["alerts_recent"]] == [
        ("dlq_review", "acme:validation")
    ]


def test_status_as_tables_on_a_seeded_database(migrated_url: str) -> None:
    """The text output shows the tenants, the queue and the alerts as tables."""
    asyncio.run(_seed(migrated_url))
    result = synckit("status", "--database-url", migrated_url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for expected in (
        "Tenants",
        "Queue",
        "Alerts",
        "acme",
        "needs_reauth: invalid_grant",
        "open",
        "140% watch",
        "7/1000",
        "synckit.poll",
        "send_mail",
        "needs_reauth",
        "dlq_review",
        "Dead letters: pending 2, review 1",
    ):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert "{" not in out.splitlines()[0]


def test_status_on_an_empty_database(migrated_url: str) -> None:
    """A fresh database reports no tenants, no jobs and no alerts, without failing."""
    text = synckit("status", "--database-url", migrated_url)
    assert text.returncode == 0, text.stderr
    assert "no tenants yet" in text.stdout and "no alerts" in text.stdout
    data = json.loads(synckit("status", "--json", "--database-url", migrated_url).stdout)
    assert data["tenants"] == [] and data["alerts_firing"] == [] and data["queue"] == {}


APP = textwrap.dedent(
    """
    from synckit.errors.exceptions import PermanentError
    from synckit.runtime.observe.alerts import register_alerts
    from synckit.runtime.jobs.handlers import JobContext, Registry

    registry = Registry()


    @registry.handler("work")
    async def work(ctx: JobContext) -> None:
        if ctx.payload.get("fail"):
            raise PermanentError("refused with Bearer s3cr3t-tok")


    register_alerts(registry)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _enqueue_work(url: str) -> None:
    db = open_database(url)
    try:
        await enqueueing.enqueue_many(
            db,
            [JobSpec("work", {"tenant": "acme", "connector": "graph"}) for _ in range(3)]
            + [JobSpec("work", {"tenant": "acme", "connector": "graph", "fail": True})],
        )
    finally:
        await db.dispose()


async def _audit(url: str) -> list[tuple[str, int, int]]:
    db = open_database(url)
    try:
        async with db.begin() as conn:
            rows = await read_audit(conn, since=datetime.now(UTC) - timedelta(hours=1))
            return [(r.app_version, r.ok, r.failed) for r in rows]
    finally:
        await db.dispose()


def test_worker_records_audit_and_serves_metrics(migrated_url: str, tmp_path: Path) -> None:
    """`synckit worker --metrics-port` counts outcomes under $SYNCKIT_APP_VERSION and
    serves /metrics until SIGTERM; no secret reaches its log."""
    (tmp_path / "obs_app.py").write_text(APP)
    asyncio.run(_enqueue_work(migrated_url))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "SYNCKIT_APP_VERSION": "9.9.0",
    }
    proc = subprocess.Popen(
        [
            *SYNCKIT,
            "worker",
            "--app",
            "obs_app:registry",
            "--database-url",
            migrated_url,
            "--metrics-port",
            str(port),
            "--poll-interval",
            "0.1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = [""]

        def metrics() -> str:
            try:
                seen[0] = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            except httpx.TransportError:
                return ""
            return seen[0] if 'outcome="succeeded"} 3.0' in seen[0] else ""

        body = wait_until(metrics, lambda: seen[0], interval=0.2)
        assert 'synckit_jobs_total{kind="work",outcome="succeeded"} 3.0' in body, body
        assert 'synckit_jobs_total{kind="work",outcome="dead"} 1.0' in body
        assert "synckit_database_up 1.0" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, err
    assert asyncio.run(_audit(migrated_url)) == [("9.9.0", 3, 1)]
    assert "job.dead" in err and "s3cr3t-tok" not in err


def test_status_rejects_a_bad_database_url() -> None:
    """A URL synckit cannot use is one line on stderr and exit code 2."""
    result = synckit("status", "--database-url", "mysql://x/y")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr

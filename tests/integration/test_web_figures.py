"""The console's figures and the actions the first tests left out (issue 20), on SQLite and
PostgreSQL through Starlette's TestClient: a dead letter resolved (one, a selection) as
``synckit dlq resolve`` resolves it, and logged; the overview's per-minute throughput and
DLQ growth against seeded rows; a job page with each attempt's full error text and the
traceback, redacted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from html import unescape
from typing import Any

from audit_rows import record_audit  # tests/
from inprocess import run_cli  # tests/
from sqlalchemy import insert, select
from starlette.testclient import TestClient
from web_app import SECRET, app, seed

from synckit.clock import utcnow
from synckit.errors import RetryPolicy
from synckit.errors.exceptions import RateLimited
from synckit.runtime.admin.audit import audit_observer
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.audit import minute_of, read_audit
from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing
from synckit.store.tables import dead_letters
from synckit.web import WebConfig, create_app
from synckit.web.base import CSRF_COOKIE

LOCAL = "http://127.0.0.1"  # the Host a loopback console answers to


@contextmanager
def console(url: str) -> Iterator[TestClient]:
    with TestClient(
        create_app(WebConfig(database_url=url, app=app)), base_url=LOCAL, follow_redirects=False
    ) as c:
        yield c


def post(client: TestClient, path: str, **form: Any) -> Any:
    if not client.cookies.get(CSRF_COOKIE):
        client.get("/login")
    return client.post(path, data={"csrf": client.cookies.get(CSRF_COOKIE), **form})


def text_of(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


async def dead_letter_rows(db: Database) -> dict[int, dict[str, Any]]:
    async with db.read() as conn:
        rows = await conn.execute(select(dead_letters))
        return {r.id: dict(r._mapping) for r in rows}


def changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {k for k in before if before[k] != after[k]}


async def test_resolving_one_or_a_selection_writes_what_dlq_resolve_writes_and_is_logged(
    db: Database, migrated_url: str
) -> None:
    from structlog.testing import capture_logs

    seeded = await seed(db)
    a0, a1, a2, g0, g1 = seeded["dead_letters"]
    before = await dead_letter_rows(db)
    with console(migrated_url) as client, capture_logs() as logs:
        one = post(client, "/dlq/action", action="resolve", ids=[str(a0)], next=f"/dlq/{a0}")
        assert one.status_code == 303 and one.headers["location"].startswith(f"/dlq/{a0}")
        assert "1 dead letter(s) resolved" in client.get(one.headers["location"]).text
        some = post(client, "/dlq/action", action="resolve", ids=[str(a1), str(g0)])
        assert some.status_code == 303
    cli = run_cli("dlq", "resolve", str(a2), "--database-url", migrated_url)
    assert cli.returncode == 0 and "1 dead letter resolved" in cli.stdout, cli.stderr
    after = await dead_letter_rows(db)

    assert {i: after[i]["status"] for i in after} == {
        a0: "resolved", a1: "resolved", g0: "resolved", a2: "resolved", g1: before[g1]["status"]
    }  # fmt: skip
    assert after[g1] == before[g1]
    by_cli = changed(before[a2], after[a2])
    assert by_cli >= {"status", "resolved_at", "status_reason"}, by_cli
    for i in (a0, a1, g0):
        # The columns the CLI changed are changed alike (the time is now, the reason says
        # who); every other column is as it was.
        for column, value in after[i].items():
            if column not in by_cli:
                assert value == before[i][column], (i, column)
            elif column == "resolved_at":
                assert isinstance(value, datetime) and value >= before[i]["first_failed_at"]
            elif column != "status_reason":
                assert value == after[a2][column], (i, column)
        assert after[i]["status_reason"] == "resolve in the console by local@testclient"
    assert after[a2]["status_reason"] == "resolved by operator"

    actions = [e for e in logs if e["event"].startswith("web.action")]
    assert [(e["event"], e["action"], e["target"], e["outcome"]) for e in actions] == [
        ("web.action", "dlq.resolve", f"ids {a0}", "1 dead letter(s) resolved"),
        ("web.action", "dlq.resolve", f"ids {a1},{g0}", "2 dead letter(s) resolved"),
    ]
    assert all(e["who"] == "local@testclient" for e in actions)


BAR = re.compile(r'title="(\d{4}-\d\d-\d\d \d\d:\d\d):00: (\d+) ok, (\d+) failed, (\d+) paced"')


async def test_overview_throughput_per_minute_and_dlq_growth_match_the_seeded_rows(
    db: Database, migrated_url: str
) -> None:
    now = utcnow()
    minute = now.replace(second=0, microsecond=0)
    # (minutes ago, tenant, ok, failed): two tenants in one minute add up; 70 minutes ago
    # is outside the last hour.
    audit = [
        (3, "acme", 7, 2),
        (3, "globex", 5, 1),
        (12, "acme", 40, 0),
        (45, "globex", 0, 9),
        (70, "acme", 1000, 1000),
    ]
    async with db.begin() as conn:
        for ago, tenant, ok, failed in audit:
            at = minute - timedelta(minutes=ago) + timedelta(seconds=20)
            await record_audit(conn, tenant, "shop", at, ok, {"server_error": failed})
        # (first failed, last attempted, status), minutes ago: 4 new in the last hour
        # (whatever their status), 2 in the hour before, 2 older (one touched lately).
        letters = [
            (10, 5, "pending"),
            (30, 30, "review"),
            (50, 2, "resolved"),
            (55, 55, "ignored"),
            (70, 65, "pending"),
            (100, 1, "pending"),
            (150, 150, "pending"),
            (150, 1, "pending"),
        ]
        await conn.execute(
            insert(dead_letters),
            [
                {
                    "tenant": "acme",
                    "connector": "shop",
                    "kind": "record:default",
                    "record_id": f"r{i}",
                    "error_class": "validation",
                    "error_message": "bad",
                    "status": status,
                    "first_failed_at": now - timedelta(minutes=first),
                    "last_attempt_at": now - timedelta(minutes=last),
                }
                for i, (first, last, status) in enumerate(letters)
            ],
        )
    expected: dict[str, tuple[int, int]] = {}
    for ago, _, ok, failed in audit:
        if ago < 180:  # the chart's three hours
            key = (minute - timedelta(minutes=ago)).strftime("%Y-%m-%d %H:%M")
            o, f = expected.get(key, (0, 0))
            expected[key] = (o + ok, f + failed)
    with console(migrated_url) as client:
        for path in ("/", "/live/overview"):
            html = client.get(path).text
            bars = {m: (int(o), int(f)) for m, o, f, _p in BAR.findall(html)}
            assert len(bars) == 180, (path, len(bars))
            shown = {m: v for m, v in bars.items() if v != (0, 0)}
            assert shown == expected, (path, shown)
            page = text_of(html)
            last_hour = sum(ok + failed for ago, _, ok, failed in audit if ago < 60)
            assert f"Last hour {last_hour:,} operations" in page
            assert "4 new in the last hour (2 the hour before)" in page, page[:2000]


async def test_a_paced_attempt_is_counted_in_its_minute_and_drawn_as_paced(
    db: Database, migrated_url: str
) -> None:
    """Issue 34 item 5: a job attempt that ends paced (rate limited) is counted in the
    paced tally of its minute, in the transaction that records it, and the overview's
    throughput chart shows it beside succeeded and failed."""
    reg = Registry()

    @reg.handler("sync.orders")
    async def sync_orders(ctx: JobContext) -> None:
        if ctx.job.payload["n"] == 1:
            raise RateLimited("429 from the shop", retry_after=timedelta(minutes=5))

    for n in (1, 2):
        await enqueueing.enqueue(
            db,
            "sync.orders",
            {"tenant": f"t{n}", "connector": "shop", "n": n},
            resource_key=f"t{n}",
        )
    before = utcnow()
    worker = Worker(
        db,
        reg,
        retry_policy=RetryPolicy.deterministic(),
        poll_interval=0.05,
        observers=[audit_observer()],
    )
    stats = await worker.run_until_idle()
    after = utcnow()
    assert (stats.paced, stats.succeeded, stats.retried, stats.dead) == (1, 1, 0, 0)
    async with db.read() as conn:
        rows = {r.tenant: r for r in await read_audit(conn, since=minute_of(before))}
    assert set(rows) == {"t1", "t2"}
    paced, ok = rows["t1"], rows["t2"]
    assert (paced.ok, paced.failed, paced.paced, dict(paced.failed_by_class)) == (0, 0, 1, {})
    assert (ok.ok, ok.failed, ok.paced) == (1, 0, 0)
    assert minute_of(before) <= paced.minute <= minute_of(after)

    key = paced.minute.strftime("%Y-%m-%d %H:%M")
    with console(migrated_url) as client:
        for path in ("/", "/live/overview"):
            html = client.get(path).text
            bars = {m: (int(o), int(f), int(p)) for m, o, f, p in BAR.findall(html)}
            assert len(bars) == 180, (path, len(bars))
            shown = {m: v for m, v in bars.items() if v != (0, 0, 0)}
            if ok.minute == paced.minute:
                assert shown == {key: (1, 0, 1)}, (path, shown)
            else:
                assert shown[key] == (0, 0, 1), (path, shown)
            assert 'paced <span class="key paced"></span>' in html
            # The paced series has a height of its own in the bar of that minute.
            bar = re.search(r'style="([^"]*)" title="' + key + r":00:", html)
            assert bar and "--h-paced: " in bar.group(1), path
            assert "--h-paced: 0.0" not in bar.group(1), bar.group(1)


class Upstream(RuntimeError):
    pass


def _deep_in_the_client(n: int) -> None:
    # ~1,850 characters: far more than the one-line reason (200) that last_error keeps.
    body = " ".join(f"field-{i} is invalid;" for i in range(80))
    raise Upstream(
        f"attempt {n}: 400 from https://api.example/v1/orders?api_key={SECRET} "
        f"(Authorization: Bearer {SECRET}): {body} END-OF-ERROR-{n}"
    )


async def test_the_job_page_shows_every_error_in_full_and_the_traceback_redacted(
    db: Database, migrated_url: str
) -> None:
    reg = Registry()
    calls: list[int] = []

    @reg.handler("sync.orders")
    async def sync_orders(ctx: JobContext) -> None:
        calls.append(1)
        _deep_in_the_client(len(calls))

    made = await enqueueing.enqueue(db, "sync.orders", {"tenant": "acme"}, max_attempts=2)
    worker = Worker(db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
    await worker.run_until_idle()
    info = await admin.get_job(db, made.id)
    assert info.status == "dead" and len(info.errors) == 2
    assert SECRET not in json.dumps(info.errors)  # stored redacted, not only shown so

    with console(migrated_url) as client:
        html = client.get(f"/jobs/{made.id}").text
    assert SECRET not in html
    page = text_of(html)
    for n in (1, 2):
        # Each attempt's error, whole: its start, every field of the body, its end.
        assert f"attempt {n}: 400 from https://api.example/v1/orders?api_key=" in page
        assert "field-0 is invalid; field-1 is invalid;" in page
        assert f"field-79 is invalid; END-OF-ERROR-{n}" in page, n
    # The traceback of the last attempt, down to the frame that raised.
    assert "Traceback (most recent call last)" in page
    assert "in _deep_in_the_client" in page and "in sync_orders" in page
    assert "Upstream: attempt 2" in page
    assert "***" in page  # the secret was there to leak: redacted where it was


async def test_the_overview_fires_the_alerts_synckit_status_fires(
    db: Database, migrated_url: str
) -> None:
    """Issue 34: "Alerts firing now" on the overview are those ``synckit status`` lists,
    on the same database (here: server errors and a failure burst seeded in the audit)."""
    from synckit.runtime.admin.status import read_status

    now = utcnow()
    minute = now.replace(second=0, microsecond=0)
    async with db.begin() as conn:
        for ago in range(1, 6):
            at = minute - timedelta(minutes=ago) + timedelta(seconds=5)
            await record_audit(conn, "acme", "shop", at, 0, {"server_error": 20})
    status = await read_status(db, now=now)
    assert status.alerts_evaluated and status.alerts_firing, "the seed fires nothing"
    with console(migrated_url) as client:
        html = client.get("/").text
    table = html.split('id="firing"', 1)[1].split("</table>", 1)[0]
    for alert in status.alerts_firing:
        assert alert.rule in table and alert.subject in table, alert
    assert f"Alerts firing now ({len(status.alerts_firing)})" in text_of(html)

"""Issue 34's lists, on SQLite and PostgreSQL through Starlette's TestClient: what a row
shows agrees with its state (no "next retry" once resolved), internal job kinds are
hidden unless asked for, pages carry totals and a previous link, attempt counts are the
worker's, and the queue's depth has a history."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from typing import Any

from starlette.testclient import TestClient
from web_app import app, seed

from synckit.store.db import Database
from synckit.web import WebConfig, create_app
from synckit.web.base import CSRF_COOKIE

LOCAL = "http://127.0.0.1"


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


async def test_a_resolved_dead_letter_shows_no_next_retry(db: Database, migrated_url: str) -> None:
    seeded = await seed(db)
    a0, a1 = seeded["dead_letters"][:2]
    with console(migrated_url) as client:
        assert "next retry" in text_of(client.get(f"/dlq/{a0}").text)
        assert post(client, "/dlq/action", action="resolve", ids=[str(a0)]).status_code == 303
        resolved = text_of(client.get(f"/dlq/{a0}").text)
        assert "resolved" in resolved and "next retry" not in resolved
        assert "next retry" in text_of(client.get(f"/dlq/{a1}").text)


JOB_LINK = re.compile(r'<a href="/jobs/(\d+)">')
REL = re.compile(r'<a href="\?([^"]*)" rel="(next|prev)">')


def job_ids(html: str) -> list[int]:
    return [int(i) for i in JOB_LINK.findall(html)]


def links(html: str) -> dict[str, str]:
    return {rel: unescape(q) for q, rel in REL.findall(html)}


async def test_internal_job_kinds_are_hidden_unless_asked_for(
    db: Database, migrated_url: str
) -> None:
    from synckit.store.jobs import enqueueing

    mine = await enqueueing.enqueue(db, "send.invoice", {"n": 1})
    tick = await enqueueing.enqueue(db, "synckit.schedule", {})
    sweep = await enqueueing.enqueue(db, "synckit.dlq_replay", {}, resource_key="shop:acme")
    poll = await enqueueing.enqueue(db, "synckit.poll", {"tenant": "acme"})
    with console(migrated_url) as client:
        shown = client.get("/jobs").text
        assert set(job_ids(shown)) == {mine.id, poll.id}
        assert "Not shown: the runtime's own jobs (synckit.schedule" in text_of(shown)
        assert "2 job(s) match" in text_of(shown)
        show = re.search(r'href="\?([^"]*)" id="show-internal-link"', shown)
        assert show is not None
        every = client.get("/jobs?" + unescape(show.group(1))).text
        assert set(job_ids(every)) == {mine.id, tick.id, sweep.id, poll.id}
        assert "4 job(s) match" in text_of(every) and "Not shown" not in every
        named = client.get("/jobs?kind=synckit.schedule").text
        assert job_ids(named) == [tick.id] and "1 job(s) match" in text_of(named)
        for status in ("pending", "succeeded"):
            by_state = client.get(f"/jobs?status={status}").text
            want = {mine.id, poll.id} if status == "pending" else set()
            assert set(job_ids(by_state)) == want
        by_tenant = client.get("/jobs?resource=shop:acme").text
        assert job_ids(by_tenant) == [] and "0 job(s) match" in text_of(by_tenant)


async def test_pages_carry_their_total_and_lead_back_as_they_led_forward(
    db: Database, migrated_url: str
) -> None:
    from synckit.store.jobs import enqueueing

    made = [(await enqueueing.enqueue(db, "send.invoice", {"n": i})).id for i in range(120)]
    newest_first = sorted(made, reverse=True)
    with console(migrated_url) as client:
        first = client.get("/jobs?kind=send.invoice").text
        assert "120 job(s) match" in text_of(first)
        assert job_ids(first) == newest_first[:50] and "prev" not in links(first)
        second = client.get("/jobs?" + links(first)["next"]).text
        assert job_ids(second) == newest_first[50:100]
        third = client.get("/jobs?" + links(second)["next"]).text
        assert job_ids(third) == newest_first[100:] and "next" not in links(third)
        assert "120 job(s) match" in text_of(third)
        back = client.get("/jobs?" + links(third)["prev"]).text
        assert job_ids(back) == newest_first[50:100]
        home = client.get("/jobs?" + links(back)["prev"]).text
        assert job_ids(home) == newest_first[:50] and "prev" not in links(home)
        assert "kind=send.invoice" in links(back)["prev"]


async def test_the_other_lists_carry_their_totals(db: Database, migrated_url: str) -> None:
    await seed(db)
    with console(migrated_url) as client:
        assert "4 tenant(s) match" in text_of(client.get("/tenants").text)
        assert "1 tenant(s) match" in text_of(client.get("/tenants?prefix=glo").text)
        dlq = text_of(client.get("/dlq").text)
        assert re.search(r"\b5 dead letter\(s\) match", dlq), dlq
        assert "3 dead letter(s) match" in text_of(client.get("/dlq?tenant=acme").text)
        outbox = text_of(client.get("/outbox").text)
        assert re.search(r"\b\d+ message\(s\) match", outbox), outbox


async def test_attempt_counts_are_the_workers(db: Database, migrated_url: str) -> None:
    """A kind whose handler allows 3 attempts, enqueued with the row's 10: a paced run
    spends none, three failures spend three and the worker gives up at 3 of 3. The
    row, the job page, its run numbers and the list all say what the worker counted."""
    from synckit.errors import RetryPolicy
    from synckit.errors.exceptions import RateLimited
    from synckit.runtime.jobs.handlers import JobContext, Registry
    from synckit.runtime.jobs.worker import Worker
    from synckit.store.jobs import admin, enqueueing

    reg = Registry()
    runs: list[int] = []

    @reg.handler("flaky.sync", max_attempts=3)
    async def flaky(ctx: JobContext) -> None:
        runs.append(ctx.job.attempts)
        if len(runs) == 1:
            raise RateLimited("429 slow down")
        raise RuntimeError(f"boom {len(runs)}")

    made = await enqueueing.enqueue(db, "flaky.sync", {"n": 1}, max_attempts=10)
    worker = Worker(db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
    await worker.run_until_idle()
    info = await admin.get_job(db, made.id)
    assert (info.status, info.attempts, info.max_attempts, len(runs)) == ("dead", 3, 3, 4)
    assert [(e["run"], e["attempt"], e["counted"]) for e in info.errors] == [
        (1, 0, False),
        (2, 1, True),
        (3, 2, True),
        (4, 3, True),
    ]
    with console(migrated_url) as client:
        page = text_of(client.get(f"/jobs/{made.id}").text)
        assert "attempts 3 of 3 (1 more run(s) failed without spending one" in page
        for label in (
            "run 1 failed (not counted)",
            "run 2 failed (attempt 1 of 3)",
            "run 4 failed (attempt 3 of 3)",
        ):
            assert label in page, label
        row = re.search(rf'<a href="/jobs/{made.id}">.*?</tr>', client.get("/jobs").text, re.S)
        assert row is not None and "3/3" in row.group(0)


async def test_the_overview_charts_the_sampled_queue_depth_with_paced_apart(
    db: Database, migrated_url: str
) -> None:
    from synckit.clock import utcnow
    from synckit.store import queue_history

    await seed(db)  # globex is paced: its due cycle is paced, not ready
    with console(migrated_url) as client:
        assert "No samples yet" in text_of(client.get("/").text)
        now = utcnow()
        async with db.read() as conn:
            counts, _capped = await queue_history.read_depth(conn, now=now)
        assert await queue_history.sample(db, now=now)
        html = client.get("/").text
    assert "No samples yet" not in text_of(html)
    chart = re.search(r'id="depth-history".*?</div>', html, re.S)
    assert chart is not None
    titles = re.findall(r'<span class="bar" style="[^"]*" title="([^"]*)"', chart.group(0))
    assert len(titles) == 1, titles
    said = ", ".join(f"{counts[name]} {name}" for name in queue_history.SERIES)
    assert said in unescape(titles[0])
    assert chart.group(0).count('class="bar gap"') == 179

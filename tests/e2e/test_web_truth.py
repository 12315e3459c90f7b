"""Issue 34 in a real Chromium (Debian's, by its path): the console tells the truth.

Each test starts its own ``synckit web`` on a freshly seeded SQLite database (the
storage paths run on both engines in tests/integration).
"""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from console_browser import (  # tests/
    CHROMIUM,
    SYNCKIT,
    console,
    env,
    page_on,
    seeded_db,
    with_db,
)

from synckit.store import workers
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import rows as dlq_rows

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
playwright_api = pytest.importorskip("playwright.sync_api")

# Each bar's class, height and colour, read in one evaluation (%s: the bars' selector).
DRAWN = """Array.from(document.querySelectorAll("%s"), e => {
    const s = getComputedStyle(e);
    return [e.className, e.getBoundingClientRect().height, s.backgroundColor];
})"""
expect = playwright_api.expect


def dlq_state(url: str) -> dict[int, tuple[Any, ...]]:
    async def read(db: Any) -> dict[int, tuple[Any, ...]]:
        return {
            r.id: (r.status, r.status_reason, r.next_retry_at, r.replay_attempts, r.lease_token)
            async for r in dlq_reads.iter_rows(db, dlq_rows.DlqFilter())
        }

    out: dict[int, tuple[Any, ...]] = with_db(url, read)
    return out


# --- 1. no accidental loss ------------------------------------------------------------------


def test_a_replay_without_the_key_leaves_the_rows_untouched_and_says_why(
    browser: Any, tmp_path: Path
) -> None:
    url, _seeded = seeded_db(tmp_path)
    before = dlq_state(url)
    with console(url, tmp_path, SYNCKIT_SECRET_KEY=None) as base, page_on(browser, base) as page:
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto("/dlq")
        page.click("button[data-group='acme/server_error']")
        flash = page.locator("#flash")
        expect(flash).to_contain_text("NOT replayed, left unchanged")
        assert "SYNCKIT_SECRET_KEY is not set" in flash.inner_text()
        assert "bad" in (flash.get_attribute("class") or "")
        # Styled as an error: not the blue box of a success.
        colour = flash.evaluate("e => getComputedStyle(e).backgroundColor")
        assert colour == "rgb(251, 230, 227)", colour
    assert dlq_state(url) == before


# --- 7. host check ----------------------------------------------------------------------------


def test_a_page_reached_through_another_host_name_gets_400(pw: Any, tmp_path: Path) -> None:
    """DNS rebinding's shape: a browser that resolves evil.example to 127.0.0.1 (by its
    resolver rules) reaches the loopback console under that name: 400, page and POST;
    the same console under 127.0.0.1 answers."""
    url, _seeded = seeded_db(tmp_path)
    with console(url, tmp_path) as base:
        port = base.rsplit(":", 1)[1]
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--host-resolver-rules=MAP evil.example 127.0.0.1"],
        )
        try:
            page = b.new_page()
            response = page.goto(f"http://evil.example:{port}/tenants/acme")
            assert response is not None and response.status == 400
            assert "not a loopback name or address" in page.inner_text("body")
            # The rebinding page's own script, posting to "its" origin.
            status = page.evaluate(
                "() => fetch('/tenants/acme/pause', {method: 'POST', body: new URLSearchParams("
                "{csrf: 'x'.repeat(32)})}).then(r => r.status)"
            )
            assert status == 400
            fine = page.goto(f"{base}/tenants/acme")
            assert fine is not None and fine.status == 200
        finally:
            b.close()


def test_allowed_host_needs_a_token(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *SYNCKIT,
            "web",
            "--allowed-host",
            "console.example.com",
            "--database-url",
            f"sqlite:///{tmp_path / 'x.db'}",
        ],
        env=env(SYNCKIT_WEB_TOKEN=None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--allowed-host needs --token" in done.stderr


# --- 2. actions act on exactly what is shown ------------------------------------------------


def test_a_filtered_group_action_touches_exactly_the_filtered_rows(
    browser: Any, tmp_path: Path
) -> None:
    """On /dlq?tenant=acme&kind=record:default the acme/server_error group shows the 3
    record:default rows; two record:invoices rows of the same tenant and class are not
    shown, and Resolve group (confirmed with its count) leaves them alone."""
    url, _seeded = seeded_db(tmp_path)

    async def more(db: Any) -> None:
        from synckit.clock import utcnow

        async with db.begin() as conn:
            await dlq_capture.capture_many(
                conn,
                [
                    dlq_capture.Failure(
                        tenant="acme",
                        connector="shop",
                        kind="record:invoices",
                        record_id=f"inv-{i}",
                        payload={"id": f"inv-{i}"},
                        error_class="server_error",
                        message="HTTP 503",
                        resource_key="shop:acme",
                    )
                    for i in range(2)
                ],
                now=utcnow(),
            )

    with_db(url, more)
    with console(url, tmp_path) as base, page_on(browser, base) as page:
        asked: list[str] = []

        def answer(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept()

        page.on("dialog", answer)
        page.goto("/dlq?tenant=acme&kind=record:default")
        group = page.locator("#groups tr", has_text="server_error")
        expect(group).to_contain_text("3")
        group.locator("button[value=resolve]").click()
        expect(page.locator("#flash")).to_contain_text("3 dead letter(s) resolved")
    assert asked == ["Resolve the 3 dead letter(s) of this group without replaying them?"]

    async def statuses(db: Any) -> dict[str, str]:
        return {
            r.record_id: r.status
            async for r in dlq_reads.iter_rows(db, dlq_rows.DlqFilter(tenants=("acme",)))
        }

    assert with_db(url, statuses) == {
        **{f"order-{i}": "resolved" for i in range(3)},
        **{f"inv-{i}": "pending" for i in range(2)},
    }


def test_select_all_and_all_matching_say_their_count(browser: Any, tmp_path: Path) -> None:
    url, _seeded = seeded_db(tmp_path)
    before = dlq_state(url)
    with console(url, tmp_path) as base, page_on(browser, base) as page:
        asked: list[str] = []

        def answer(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.dismiss()  # changes nothing

        page.on("dialog", answer)
        page.goto("/dlq?tenant=globex")
        page.check("#dead-letters .select-all")
        expect(page.locator(".selected-count")).to_have_text("2 selected on this page")
        page.click(".bulk button[value=ignore]")
        page.click("#all-matching button[value=resolve]")
        assert asked == [
            "Ignore 2 selected dead letter(s)?",
            "Resolve the 2 matching dead letter(s) without replaying them?",
        ]
    assert dlq_state(url) == before


# --- 5. history ------------------------------------------------------------------------------


def test_the_throughput_bars_have_a_colour_and_a_height(browser: Any, tmp_path: Path) -> None:
    """Succeeded, failed and paced per minute: each series painted in its own colour."""
    url, _seeded = seeded_db(tmp_path)

    async def audit(db: Any) -> None:
        from datetime import timedelta

        from audit_rows import record_audit  # tests/

        from synckit.clock import utcnow

        minute = utcnow().replace(second=0, microsecond=0)
        async with db.begin() as conn:
            for ago, ok, failed, paced in ((2, 30, 10, 0), (5, 12, 0, 8), (9, 0, 6, 0)):
                at = minute - timedelta(minutes=ago) + timedelta(seconds=5)
                await record_audit(
                    conn, "acme", "shop", at, ok, {"server_error": failed}, paced=paced
                )

    with_db(url, audit)
    with console(url, tmp_path) as base, page_on(browser, base) as page:
        page.goto("/")
        # Query and measure in one turn of the page's script: the live part is swapped
        # every 0.5 s, and an element swapped out between the two has no style.
        drawn = page.evaluate(DRAWN % "#throughput .bar i")
        key = page.evaluate(
            "getComputedStyle(document.querySelector('h2 .key.paced')).backgroundColor"
        )
    painted = [(cls, h, colour) for cls, h, colour in drawn if h > 0]
    transparent = "rgba(0, 0, 0, 0)"
    assert {cls for cls, _h, _c in painted} == {"ok", "bad", "paced"}, drawn[-12:]
    assert all(colour != transparent for _cls, _h, colour in painted), painted
    colours = {cls: {c for k, _h, c in painted if k == cls} for cls in ("ok", "bad", "paced")}
    assert colours == {
        "ok": {"rgb(30, 138, 76)"},
        "bad": {"rgb(192, 57, 43)"},
        "paced": {"rgb(183, 121, 31)"},  # --warn, as the queue-depth chart's paced
    }
    assert key == "rgb(183, 121, 31)"  # the legend's key matches the bars
    # The tallest minute (40 operations) fills the chart; 12 of 40 is about 30% of it.
    tallest = max(h for cls, h, _c in painted if cls == "ok")
    assert len([1 for cls, _h, _c in painted if cls == "ok"]) == 2 and tallest > 20
    # One minute paced 8: drawn once, 8/30 of the tallest succeeded bar (30 ok).
    paced = [h for cls, h, _c in painted if cls == "paced"]
    assert len(paced) == 1 and 0.2 * tallest < paced[0] < 0.34 * tallest, (paced, tallest)


# --- 4. workers ------------------------------------------------------------------------------


def test_the_workers_page_lists_a_live_worker_and_marks_it_lost_once_killed(
    browser: Any, tmp_path: Path
) -> None:
    url, _seeded = seeded_db(tmp_path)
    worker = subprocess.Popen(
        [
            *SYNCKIT,
            "worker",
            "--app",
            "web_app:app",
            "--database-url",
            url,
            "--presence-every",
            "0.5",
            "--concurrency",
            "3",
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with console(url, tmp_path) as base, page_on(browser, base) as page:
            page.goto("/workers")
            row = page.locator(f"#workers tr:has(td:text-is('{worker.pid}'))")
            # Live: the page refreshes itself every 0.5 s.
            expect(row.locator(".worker-state")).to_have_text("alive", timeout=30_000)
            assert "3" in row.inner_text()
            page.goto("/")
            expect(page.locator("#workers-alive")).to_have_text("1", timeout=10_000)
            page.goto("/workers")
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
            # Lost after 3 silent heartbeats (1.5 s); the budget is for a busy machine.
            expect(row.locator(".worker-state")).to_have_text("lost", timeout=30_000)
            seen = datetime.now(UTC)
            (last,) = [
                w
                for w in with_db(url, lambda db: workers.list_workers(db, now=seen))
                if w.pid == worker.pid
            ]
            # Not before its heartbeats ran out: counted from its last heartbeat, not from
            # the kill (a busy machine's last beat can be late, or the kill's reaping).
            assert seen - last.last_seen_at >= last.lost_after, (last, seen)
            assert "silent for more than 1s" in row.inner_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_the_queue_depth_bars_have_a_colour_and_a_height_and_paced_its_own(
    browser: Any, tmp_path: Path
) -> None:
    async def samples(db: Any) -> None:
        from datetime import timedelta

        from synckit.clock import utcnow
        from synckit.store.tables import queue_samples

        minute = utcnow().replace(second=0, microsecond=0)
        async with db.begin() as conn:
            for ago, ready, paced in ((3, 20, 0), (2, 10, 30), (1, 0, 5)):
                await conn.execute(
                    queue_samples.insert().values(
                        minute=minute - timedelta(minutes=ago),
                        ready=ready,
                        scheduled=0,
                        retrying=2,
                        paced=paced,
                        running=1,
                    )
                )

    url, _seeded = seeded_db(tmp_path)
    with_db(url, samples)
    with console(url, tmp_path) as base, page_on(browser, base) as page:
        page.goto("/")
        drawn = page.evaluate(DRAWN % "#depth-history .bar i")
        shown = page.locator("#depth-history .bar:not(.gap)")
        assert shown.count() == 3
        assert "10 ready, 2 retrying, 30 paced" in (shown.nth(1).get_attribute("title") or "")
    painted = [(cls, h, colour) for cls, h, colour in drawn if h > 0]
    colours = {cls: colour for cls, _h, colour in painted}
    assert set(colours) == {"q-running", "q-ready", "q-retrying", "q-paced"}, drawn
    assert colours["q-paced"] == "rgb(183, 121, 31)" != colours["q-ready"]
    assert "rgba(0, 0, 0, 0)" not in colours.values()
    # The deepest minute (43) fills the chart: its 30 paced are the tallest segment.
    tallest = max(painted, key=lambda p: p[1])
    assert tallest[0] == "q-paced" and tallest[1] > 20


# --- 6. lists --------------------------------------------------------------------------------


def test_internal_kinds_are_one_click_away_and_pages_lead_back(
    browser: Any, tmp_path: Path
) -> None:
    from synckit.store.jobs import enqueueing

    async def receipts(db: Any) -> dict[str, Any]:
        return {
            "receipts": [
                (await enqueueing.enqueue(db, "send.receipt", {"n": i})).id for i in range(60)
            ]
        }

    async def newest_tick(db: Any) -> int:
        made: int = (await enqueueing.enqueue(db, "synckit.schedule", {})).id
        return made

    url, _seeded = seeded_db(tmp_path, before=receipts)
    tick = with_db(url, newest_tick)
    with console(url, tmp_path) as base, page_on(browser, base) as page:
        page.goto("/jobs")
        assert page.locator(f"#jobs a[href='/jobs/{tick}']").count() == 0
        expect(page.locator("#hidden-kinds")).to_contain_text("synckit.schedule")
        page.click("#show-internal-link")
        expect(page.locator(f"#jobs a[href='/jobs/{tick}']")).to_have_count(1)
        assert page.locator("#show-internal").is_checked()
        page.goto("/jobs?kind=send.receipt")
        expect(page.locator("#total")).to_have_text("60 job(s) match")
        first = page.locator("#jobs tbody tr").count()
        page.click("a[rel=next]")
        expect(page.locator("#jobs tbody tr")).to_have_count(60 - first)
        page.click("a[rel=prev]")
        expect(page.locator("#jobs tbody tr")).to_have_count(first)
        assert page.locator("a[rel=prev]").count() == 0


# --- 2. outcomes as they happened ------------------------------------------------------------


def test_a_dead_cycle_replayed_while_its_next_cycle_is_queued_says_nothing_was_re_run(
    browser: Any, tmp_path: Path
) -> None:
    async def dead_cycle(db: Any) -> dict[str, Any]:
        from sqlalchemy import update

        from synckit.clock import utcnow
        from synckit.store.jobs import enqueueing, outcomes
        from synckit.store.tables import jobs

        key = "poll:acme:orders"
        dead = await enqueueing.enqueue(db, "synckit.poll", {"tenant": "acme"}, unique_key=key)
        async with db.begin() as conn:
            await conn.execute(update(jobs).where(jobs.c.id == dead.id).values(status="dead"))
            await outcomes.dead_letter_job(
                conn,
                job_id=dead.id,
                kind="synckit.poll",
                payload={"tenant": "acme"},
                resource_key="shop:acme",
                error_class="transient",
                message="timeout",
                traceback=None,
                trace_id=None,
                attempts=5,
                now=utcnow(),
            )
        queued = await enqueueing.enqueue(db, "synckit.poll", {"tenant": "acme"}, unique_key=key)
        (letter,) = [r async for r in dlq_reads.iter_rows(db, dlq_rows.DlqFilter())]
        return {"letter": letter.id, "queued": queued.id}

    url, seeded = seeded_db(tmp_path, before=dead_cycle)
    with console(url, tmp_path) as base, page_on(browser, base) as page:
        page.goto(f"/dlq/{seeded['letter']}")
        assert "next retry" in page.inner_text(".facts")
        page.click("button[value=replay]")
        flash = page.locator("#flash")
        expect(flash).to_contain_text("1 resolved without re-run")
        assert f"job {seeded['queued']} (pending) holds its unique key" in flash.inner_text()
        assert "replayed and resolved" not in flash.inner_text()
        assert "bad" not in (flash.get_attribute("class") or "")
        facts = page.inner_text(".facts")
        assert "next retry" not in facts
        expect(page.locator("h1 .state")).to_have_text("resolved")

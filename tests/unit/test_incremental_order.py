"""Incremental on ascending, descending and unordered listings; crashes and expired cursors
mid-walk; the newest-first event feed. In-memory APIs (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synckit import (
    Connector,
    CursorPaginator,
    IdCursorPaginator,
    Incremental,
    ListingOrderError,
    NewestFirstFeed,
    Page,
    SyncContext,
)
from synckit.errors.classify import classify
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.raising import exception_for
from synckit.testing import FakeAPI, NewestFirstList

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def iso(second: int) -> str:
    return (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z")


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url="https://api.test", transport=httpx.MockTransport(handler))


def listing(rows: list[dict[str, Any]]) -> Callable[[httpx.Request], httpx.Response]:
    """One page of ``rows`` exactly as given."""

    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"items": rows, "next_cursor": None})

    return api


async def drain(pages: AsyncIterator[Page]) -> tuple[list[Any], Any]:
    handed: list[Any] = []
    checkpoint = None
    async for page in pages:
        handed += page.records
        checkpoint = page.checkpoint
    return handed, checkpoint


async def test_newest_first_records_are_all_handed_on_not_just_the_first() -> None:
    """The issue's case: handed c, b, a (newest first), every one is handed on."""
    rows = [{"id": rid, "updated_at": iso(s)} for rid, s in [("c", 3), ("b", 2), ("a", 1)]]
    async with client(listing(rows)) as http:
        handed, checkpoint = await drain(
            Incremental().pages(http, "/items", CursorPaginator(records="items"), None)
        )
    assert [r["id"] for r in handed] == ["c", "b", "a"]
    assert checkpoint["high"] == [iso(3), "c"] and checkpoint["order"] == "descending"


@pytest.mark.parametrize(
    ("order", "seconds", "found"),
    [
        ("auto", [1, 1, 2, 3], "ascending"),
        ("auto", [3, 3, 2, 1], "descending"),
        ("descending", [5], "descending"),
        ("ascending", [5, 5], "ascending"),
    ],
)
async def test_the_order_is_declared_or_found_from_the_first_distinct_values(
    order: Literal["ascending", "descending", "auto"], seconds: list[int], found: str
) -> None:
    rows = [{"id": str(i), "updated_at": iso(s)} for i, s in enumerate(seconds)]
    async with client(listing(rows)) as http:
        handed, checkpoint = await drain(
            Incremental(order=order).pages(http, "/x", CursorPaginator(records="items"), None)
        )
    assert len(handed) == len(rows)
    assert checkpoint["order"] == found


@pytest.mark.parametrize(
    ("order", "seconds"),
    [("auto", [1, 3, 2]), ("auto", [3, 1, 2]), ("ascending", [2, 1]), ("descending", [1, 2])],
)
async def test_a_listing_out_of_order_is_an_error_handing_nothing_on(
    order: Literal["ascending", "descending", "auto"], seconds: list[int]
) -> None:
    rows = [{"id": str(i), "updated_at": iso(s)} for i, s in enumerate(seconds)]
    handed: list[Any] = []
    async with client(listing(rows)) as http:
        with pytest.raises(ListingOrderError, match=r"^listing /tickets is not sorted by"):
            async for page in Incremental(order=order).pages(
                http, "/tickets", CursorPaginator(records="items"), None
            ):
                handed += page.records
    assert handed == []


async def test_a_later_listing_against_the_order_found_before_is_an_error() -> None:
    """The order found on the first cycle is the stream's: an API that flips is caught."""
    rows = [{"id": str(i), "updated_at": iso(s)} for i, s in enumerate([3, 2, 1])]
    inc = Incremental()
    async with client(listing(rows)) as http:
        _, checkpoint = await drain(inc.pages(http, "/x", CursorPaginator(records="items"), None))
    flipped = [{"id": str(i), "updated_at": iso(s)} for i, s in enumerate([4, 5])]
    async with client(listing(flipped)) as http:
        with pytest.raises(ListingOrderError, match="in a listing descending"):
            await drain(inc.pages(http, "/x", CursorPaginator(records="items"), checkpoint))


def test_a_bad_order_is_refused_when_declared() -> None:
    with pytest.raises(ConfigurationError, match="order must be one of"):
        Incremental(order="newest")  # type: ignore[arg-type]


async def test_a_descending_walk_stops_at_the_old_watermark_and_fetches_no_further() -> None:
    """2,000 customers in 20 pages, then 35 new ones: the second cycle reads 1 page past
    the new ones, hands on exactly the 35, and the third cycle hands on nothing."""
    api = FakeAPI()
    customers = NewestFirstList("cus")
    customers.add(2000)
    customers.mount(api, "/v1/customers")
    inc = Incremental(updated_at="created", since_param=None, order="descending")
    paginator = IdCursorPaginator()
    async with httpx.AsyncClient(base_url="https://api.test", transport=api.transport()) as http:
        first, checkpoint = await drain(
            inc.pages(http, "/v1/customers", paginator, None, params={"limit": 100})
        )
        assert len(api.requests) == 20
        assert sorted(r["id"] for r in first) == sorted(customers.ids())
        new = customers.add(35)
        before = len(api.requests)
        second, checkpoint = await drain(
            inc.pages(http, "/v1/customers", paginator, checkpoint, params={"limit": 10})
        )
        assert sorted(r["id"] for r in second) == sorted(o["id"] for o in new)
        assert len(api.requests) - before == 4  # 35 new ones in 4 pages of 10
        third, _ = await drain(
            inc.pages(http, "/v1/customers", paginator, checkpoint, params={"limit": 10})
        )
        assert third == []


async def test_ties_at_the_watermark_across_pages_and_cycles_are_handed_on_once() -> None:
    """Three objects a second (ties), pages of 2: every object once, over two cycles."""
    api = FakeAPI()
    objs = NewestFirstList("evt", per_second=3)
    objs.add(10)
    objs.mount(api, "/v1/events")
    inc = Incremental(updated_at="created", since_param=None)
    async with httpx.AsyncClient(base_url="https://api.test", transport=api.transport()) as http:
        first, checkpoint = await drain(
            inc.pages(http, "/v1/events", IdCursorPaginator(), checkpoint=None, params={"limit": 2})
        )
        objs.add(4)  # the first one ties with the newest of the first cycle
        second, _ = await drain(
            inc.pages(http, "/v1/events", IdCursorPaginator(), checkpoint, params={"limit": 2})
        )
    handed = [r["id"] for r in first + second]
    assert sorted(handed) == sorted(objs.ids())
    assert len(handed) == len(set(handed))


# --- crash and expiry mid-listing: a property over random histories --------------------


class KeysetApi:
    """``GET /items?since=&cursor=``: rows sorted by ``(updated_at, id)`` either way, an
    inclusive ``since``, keyset cursors held server-side that the test can expire (410)."""

    def __init__(self, order: Literal["ascending", "descending"], limit: int) -> None:
        self.rows: dict[str, int] = {}
        self.order = order
        self.limit = limit
        self.cursors: dict[str, tuple[int, str]] = {}
        self.issued = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        q = request.url.params
        desc = self.order == "descending"
        rows = sorted(((s, rid) for rid, s in self.rows.items()), reverse=desc)
        if "since" in q:
            since = datetime.fromisoformat(q["since"].replace("Z", "+00:00"))
            rows = [r for r in rows if T0 + timedelta(seconds=r[0]) >= since]
        if "cursor" in q:
            if q["cursor"] not in self.cursors:
                return httpx.Response(410, json={"error": "cursor expired"})
            after = self.cursors[q["cursor"]]
            rows = [r for r in rows if (r < after if desc else r > after)]
        page, rest = rows[: self.limit], rows[self.limit :]
        token = None
        if rest:
            self.issued += 1
            token = f"c{self.issued}"
            self.cursors[token] = page[-1]
        return httpx.Response(
            200,
            json={
                "items": [{"id": rid, "updated_at": iso(s), "s": s} for s, rid in page],
                "next_cursor": token,
            },
        )


async def raise_like_ctx_http(response: httpx.Response) -> None:
    """What ctx.http does with a failed answer: the synckit exception of its class (a 404
    or 410 is a PermanentError carrying ``not_found``)."""
    if response.status_code >= 400:
        raise exception_for(classify(response, now=datetime.now(UTC)))


async def run_history(
    order: Literal["ascending", "descending"],
    declared: Literal["ascending", "descending", "auto"],
    since_param: str | None,
    limit: int,
    lookback: int,
    seed: Any,
    steps: int,
) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """Random puts (the clock moves 0 to 2 s: ties), pages read, crashes (the cycle is
    abandoned after a committed page and resumed from its checkpoint), expired cursors;
    then quiet cycles until nothing is new. Returns the versions handed on and the rows."""
    api = KeysetApi(order, limit)
    inc = Incremental(since_param=since_param, lookback=timedelta(seconds=lookback), order=declared)
    paginator = CursorPaginator(records="items")
    handed: list[tuple[str, int]] = []
    checkpoint: Any = None
    clock = 0
    gen: AsyncIterator[Page] | None = None
    http = httpx.AsyncClient(
        base_url="https://api.test",
        transport=httpx.MockTransport(api.handler),
        event_hooks={"response": [raise_like_ctx_http]},
    )

    async def next_page() -> bool:
        """Read one page of the cycle in progress (starting one); False at its end."""
        nonlocal gen, checkpoint
        if gen is None:
            gen = inc.pages(http, "/items", paginator, checkpoint)
        try:
            page = await anext(gen)  # type: ignore[arg-type]
        except StopAsyncIteration:
            gen = None
            return False
        except Exception:  # too many restarts in one cycle: the cycle fails, retried later
            gen = None
            return False
        handed.extend((r["id"], r["s"]) for r in page.records)
        # The runtime stores it as JSON.
        checkpoint = json.loads(json.dumps(page.checkpoint))
        return True

    try:
        for _ in range(steps):
            r = seed.random()
            listing = gen is not None or (checkpoint or {}).get("resume") is not None
            # Ascending, a record written behind a listing's cursor is a late writer,
            # found only within the lookback: writes come between listings. Descending,
            # writes land at the top, where the next walk begins: they come any time.
            if r < 0.35 and (order == "descending" or not listing):
                clock += seed.choice([0, 0, 1, 1, 2])
                api.rows[f"r{seed.randrange(12)}"] = clock
            elif r < 0.42:
                api.cursors.clear()
            elif r < 0.5:
                if gen is not None:
                    await gen.aclose()  # type: ignore[attr-defined]
                    gen = None  # a crash after the last committed page
            else:
                await next_page()
        if gen is not None:
            await gen.aclose()  # type: ignore[attr-defined]
            gen = None
        for _ in range(3):  # quiet cycles: each reads to the end
            while await next_page():
                pass
    finally:
        await http.aclose()
    return handed, dict(api.rows)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["ascending", "descending"]),
    st.booleans(),
    st.sampled_from(["since", None]),
    st.integers(1, 4),
    st.integers(0, 2),
    st.randoms(use_true_random=False),
    st.integers(5, 60),
)
def test_crashes_and_expired_cursors_mid_listing_lose_and_repeat_nothing(
    order: Literal["ascending", "descending"],
    declare: bool,
    since_param: str | None,
    limit: int,
    lookback: int,
    seed: Any,
    steps: int,
) -> None:
    """Every final version is handed on, and no version twice, whatever the order, the
    ties, the page size, the crashes and the cursors expiring between pages."""
    handed, rows = asyncio.run(
        run_history(order, order if declare else "auto", since_param, limit, lookback, seed, steps)
    )
    assert len(handed) == len(set(handed)), f"repeated: {sorted(handed)}"
    assert set(rows.items()) <= set(handed), f"lost: {set(rows.items()) - set(handed)}"


# --- the newest-first event feed ------------------------------------------------------


async def test_the_feed_backfills_then_catches_up_oldest_first_page_by_page() -> None:
    api = FakeAPI()
    events = NewestFirstList("evt")
    events.add(25)
    events.mount(api, "/v1/events")
    feed = NewestFirstFeed(limit=10)
    async with httpx.AsyncClient(base_url="https://api.test", transport=api.transport()) as http:
        backfill, checkpoint = await drain(feed.pages(http, "/v1/events", None))
        assert [e["id"] for e in backfill] == events.ids()  # newest first
        assert checkpoint["newest"] == events.ids()[0] and "walk" not in checkpoint
        new = events.add(23)
        before = len(api.requests)
        pages = [p async for p in feed.pages(http, "/v1/events", checkpoint)]
    caught = [e["id"] for p in pages for e in p.records]
    assert caught == [o["id"] for o in new]  # oldest first
    # Each page's checkpoint is the newest event of that page: exact if the cycle dies.
    assert [p.checkpoint["newest"] for p in pages][:3] == [
        new[9]["id"],
        new[19]["id"],
        new[22]["id"],
    ]
    assert all("ending_before" in r.query for r in api.requests[before:])


async def test_the_feed_resyncs_when_its_position_fell_out_of_retention() -> None:
    """The newest event handed on is dropped (retention): the feed walks down again from
    the top to that event's time, handing on only what it had not."""
    api = FakeAPI()
    events = NewestFirstList("evt", per_second=2)
    events.add(8)
    events.mount(api, "/v1/events")
    feed = NewestFirstFeed(limit=3)
    async with httpx.AsyncClient(
        base_url="https://api.test",
        transport=api.transport(),
        event_hooks={"response": [raise_like_ctx_http]},
    ) as http:
        first, checkpoint = await drain(feed.pages(http, "/v1/events", None))
        new = events.add(7)
        with events.lock:  # the position, and nothing else, drops out of retention
            events.objects = [o for o in events.objects if o["id"] != checkpoint["newest"]]
        second, checkpoint = await drain(feed.pages(http, "/v1/events", checkpoint))
        third, _ = await drain(feed.pages(http, "/v1/events", checkpoint))
    assert sorted(e["id"] for e in second) == sorted(o["id"] for o in new)
    assert third == []
    handed = [e["id"] for e in first + second]
    assert len(handed) == len(set(handed))


async def test_a_feed_walk_that_dies_mid_way_resumes_where_it_was() -> None:
    api = FakeAPI()
    events = NewestFirstList("evt")
    events.add(30)
    events.mount(api, "/v1/events")
    feed = NewestFirstFeed(limit=10)
    handed: list[str] = []
    async with httpx.AsyncClient(base_url="https://api.test", transport=api.transport()) as http:
        gen = feed.pages(http, "/v1/events", None)
        page = await anext(gen)
        await gen.aclose()  # the worker dies after the first page's commit
        handed += [e["id"] for e in page.records]
        events.add(5)  # meanwhile, newer events
        rest, checkpoint = await drain(feed.pages(http, "/v1/events", page.checkpoint))
        handed += [e["id"] for e in rest]
        later, _ = await drain(feed.pages(http, "/v1/events", checkpoint))
        handed += [e["id"] for e in later]
    assert sorted(handed) == sorted(events.ids())
    assert len(handed) == len(set(handed))


async def run_feed(
    seed: Any, limit: int, per_second: int, steps: int
) -> tuple[list[str], set[str]]:
    """Random events added (ties when ``per_second`` > 1), pages read, crashes after a
    committed page, and retention dropping the oldest events or the feed's position;
    then quiet cycles. Returns the ids handed on and the ids the feed still holds."""
    api = FakeAPI()
    events = NewestFirstList("evt", per_second=per_second)
    events.mount(api, "/v1/events")
    feed = NewestFirstFeed(limit=limit)
    handed: list[str] = []
    checkpoint: Any = None
    gen: AsyncIterator[Page] | None = None
    http = httpx.AsyncClient(
        base_url="https://api.test",
        transport=api.transport(),
        event_hooks={"response": [raise_like_ctx_http]},
    )

    async def next_page() -> bool:
        nonlocal gen, checkpoint
        if gen is None:
            gen = feed.pages(http, "/v1/events", checkpoint)
        try:
            page = await anext(gen)  # type: ignore[arg-type]
        except StopAsyncIteration:
            gen = None
            return False
        handed.extend(e["id"] for e in page.records)
        checkpoint = json.loads(json.dumps(page.checkpoint))
        return True

    try:
        for _ in range(steps):
            r = seed.random()
            if r < 0.3:
                events.add(seed.randrange(1, 6))
            elif r < 0.36 and events.objects:
                events.expire(max(1, len(events.objects) - seed.randrange(1, 4)))
            elif r < 0.42 and checkpoint and checkpoint.get("newest") and gen is None:
                with events.lock:  # the position itself drops out
                    events.objects = [o for o in events.objects if o["id"] != checkpoint["newest"]]
            elif r < 0.5:
                if gen is not None:
                    await gen.aclose()  # type: ignore[attr-defined]
                    gen = None
            else:
                await next_page()
        if gen is not None:
            await gen.aclose()  # type: ignore[attr-defined]
            gen = None
        for _ in range(3):
            while await next_page():
                pass
    finally:
        await http.aclose()
    return handed, set(events.ids())


@settings(max_examples=100, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 4), st.integers(1, 3), st.integers(5, 50))
def test_the_feed_loses_and_repeats_nothing_across_crashes_and_retention(
    seed: Any, limit: int, per_second: int, steps: int
) -> None:
    """Every event the feed still holds at the end was handed on, and none twice, however
    the crashes, the ties and the retention (of old events, or of the position) fall."""
    handed, held = asyncio.run(run_feed(seed, limit, per_second, steps))
    assert len(handed) == len(set(handed)), "repeated"
    assert held <= set(handed), f"lost: {sorted(held - set(handed))}"


class _Ctx(SyncContext):
    """Just enough of a hook's context for pages(): a client and the stream's names."""

    def __init__(self, http: httpx.AsyncClient, connector: Connector[Any], stream: str) -> None:
        self.http, self.connector, self.stream = http, connector, stream

    def for_record(self, record_id: str) -> SyncContext:
        raise NotImplementedError

    async def intent(self, key: str, **kwargs: Any) -> Any:  # type: ignore[override]
        raise NotImplementedError

    def auth_for(self, declaration: Any) -> httpx.Auth:
        raise NotImplementedError


async def test_given_ctx_an_out_of_order_listing_names_the_stream_and_connector() -> None:
    class Billing(Connector):
        name = "billing"

    rows = [{"id": str(i), "updated_at": iso(s)} for i, s in enumerate([1, 3, 2])]
    async with client(listing(rows)) as http:
        ctx = _Ctx(http, Billing("acme"), "invoices")
        with pytest.raises(
            ListingOrderError,
            match=r"^stream 'invoices' of connector 'billing': listing /v1/invoices is not sorted",
        ):
            await drain(
                Incremental().pages(ctx, "/v1/invoices", CursorPaginator(records="items"), None)
            )

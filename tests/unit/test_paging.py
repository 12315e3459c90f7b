"""Paginators against an in-memory API (httpx.MockTransport); the watermark as a pure function."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

from synckit import (
    CursorPaginator,
    IdCursorPaginator,
    Incremental,
    LinkHeaderPaginator,
    NextUrlPaginator,
    OffsetPaginator,
    PageNumberPaginator,
    Paginator,
)
from synckit.connectors.incremental import Watermark, parse_instant
from synckit.connectors.paging import json_path
from synckit.errors.exceptions import ConfigurationError, PermanentError

ITEMS = [{"id": i} for i in range(7)]


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url="https://api.test", transport=httpx.MockTransport(handler))


async def collect(
    p: Paginator, handler: Callable[[httpx.Request], httpx.Response], resume: Any = None
) -> tuple[list[list[int]], list[Any]]:
    async with client(handler) as http:
        pages = [pg async for pg in p.pages(http, "/items", params={"q": "x"}, resume=resume)]
    return [[r["id"] for r in pg.records] for pg in pages], [pg.checkpoint for pg in pages]


async def test_cursor_paginator_sends_the_cursor_back_until_there_is_none() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        assert request.url.params["q"] == "x"
        start = int(request.url.params.get("after", "0"))
        nxt = str(start + 3) if start + 3 < len(ITEMS) else None
        return httpx.Response(200, json={"data": {"items": ITEMS[start : start + 3], "next": nxt}})

    p = CursorPaginator(records="data.items", cursor="data.next", param="after")
    assert await collect(p, api) == ([[0, 1, 2], [3, 4, 5], [6]], ["3", "6", "6"])
    assert await collect(p, api, resume="6") == ([[6]], ["6"])


async def test_cursor_paginator_stops_on_has_more_false() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"items": ITEMS[:2], "next": "again", "more": False})

    p = CursorPaginator(records="items", cursor="next", has_more="more")
    assert (await collect(p, api))[0] == [[0, 1]]


async def test_next_url_paginator_calls_the_link_as_given_without_the_first_params() -> None:
    seen: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        start = int(request.url.params.get("skip", "0"))
        nxt = f"https://api.test/items?skip={start + 3}" if start + 3 < len(ITEMS) else None
        return httpx.Response(200, json={"value": ITEMS[start : start + 3], "@odata.nextLink": nxt})

    p = NextUrlPaginator(records="value", next="@odata.nextLink")
    ids, _ = await collect(p, api)
    assert ids == [[0, 1, 2], [3, 4, 5], [6]]
    assert seen == [
        "https://api.test/items?q=x",
        "https://api.test/items?skip=3",
        "https://api.test/items?skip=6",
    ]


async def test_link_header_paginator_follows_rel_next_relative_to_the_page() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params.get("page", "1"))
        headers = {"Link": f'</items?page={page + 1}>; rel="next", </items?page=1>; rel="first"'}
        return httpx.Response(
            200, json=ITEMS[(page - 1) * 3 : page * 3], headers=headers if page < 3 else {}
        )

    ids, checkpoints = await collect(LinkHeaderPaginator(), api)
    assert ids == [[0, 1, 2], [3, 4, 5], [6]]
    assert checkpoints[0] == "https://api.test/items?page=2"


@pytest.mark.parametrize(
    "elsewhere",
    [
        "https://attacker.example/items?page=2",
        "http://api.test/items?page=2",  # the same host, in clear text
        "https://api.test:8443/items?page=2",
        "//attacker.example/items?page=2",  # scheme-relative
    ],
)
@pytest.mark.parametrize("shape", ["body", "link"])
async def test_a_next_page_on_another_origin_is_not_followed(shape: str, elsewhere: str) -> None:
    """A hostile or compromised API naming another origin as its next page: a permanent
    error naming both origins, and no request leaves for it (the client would have sent
    the tenant's credentials there). Same-origin links and relative ones are followed;
    other_origins=True follows the others too."""
    asked: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if request.url.params.get("page") == "2":
            return httpx.Response(200, json={"items": ITEMS[3:]})
        if shape == "body":
            return httpx.Response(200, json={"items": ITEMS[:3], "next": elsewhere})
        return httpx.Response(
            200, json={"items": ITEMS[:3]}, headers={"Link": f'<{elsewhere}>; rel="next"'}
        )

    def paginator(**kw: Any) -> Paginator:
        if shape == "body":
            return NextUrlPaginator(records="items", **kw)
        return LinkHeaderPaginator(records="items", **kw)

    with pytest.raises(PermanentError, match="not followed") as refused:
        await collect(paginator(), api)
    assert "page=2" not in str(refused.value) and "api.test" in str(refused.value)
    assert len(asked) == 1 and asked[0].startswith("https://api.test/items")
    asked.clear()
    got, _ = await collect(paginator(other_origins=True), api)
    assert got == [[0, 1, 2], [3, 4, 5, 6]] and len(asked) == 2


@pytest.mark.parametrize("same", ["https://api.test/items?page=2", "/items?page=2"])
async def test_a_next_page_on_the_same_origin_or_relative_is_followed(same: str) -> None:
    def api(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("page") == "2":
            return httpx.Response(200, json={"items": ITEMS[3:]})
        return httpx.Response(200, json={"items": ITEMS[:3], "next": same})

    got, _ = await collect(NextUrlPaginator(records="items"), api)
    assert got == [[0, 1, 2], [3, 4, 5, 6]]


async def test_offset_paginator_stops_on_a_short_page_or_the_total() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        off, lim = int(request.url.params["offset"]), int(request.url.params["limit"])
        return httpx.Response(200, json={"rows": ITEMS[off : off + lim], "total": len(ITEMS)})

    assert (await collect(OffsetPaginator(records="rows", limit=3), api))[0] == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
    ]
    # Exactly full pages: the total says when to stop, not an extra empty request.
    calls = []

    def six(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        off = int(request.url.params["offset"])
        return httpx.Response(200, json={"rows": ITEMS[:6][off : off + 3], "total": 6})

    ids, _ = await collect(OffsetPaginator(records="rows", limit=3, total="total"), six)
    assert ids == [[0, 1, 2], [3, 4, 5]] and len(calls) == 2


async def test_page_number_paginator_stops_on_an_empty_page_or_total_pages() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params["page"])
        assert request.url.params.get("per_page") in (None, "3")
        return httpx.Response(200, json={"items": ITEMS[(page - 1) * 3 : page * 3], "pages": 3})

    assert (await collect(PageNumberPaginator(records="items", per_page=3), api)) == (
        [[0, 1, 2], [3, 4, 5], [6]],
        [2, 3, 3],
    )
    assert (await collect(PageNumberPaginator(records="items", total_pages="pages"), api))[0] == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
    ]


async def test_a_body_without_records_or_a_stuck_cursor_is_a_permanent_error() -> None:
    def no_list(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"items": {"not": "a list"}})

    with pytest.raises(PermanentError, match="no list of records at 'items'"):
        await collect(CursorPaginator(records="items"), no_list)

    def stuck(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"items": [], "next_cursor": "same"})

    with pytest.raises(PermanentError, match="does not advance"):
        await collect(CursorPaginator(records="items"), stuck, resume="same")

    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>", headers={"content-type": "text/html"})

    with pytest.raises(PermanentError, match="not JSON"):
        await collect(CursorPaginator(records="items"), html)


async def test_max_pages_ends_a_listing_early() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "items": [{"id": 1}],
                "next_cursor": str(len(json.dumps(dict(request.url.params)))),
            },
        )

    assert len((await collect(CursorPaginator(records="items", max_pages=1), api))[0]) == 1


def test_json_path_and_bad_declarations() -> None:
    assert json_path({"a": [{"b": 1}]}, "a.0.b") == 1
    assert json_path({"a": 1}, "a.b") is None
    with pytest.raises(ConfigurationError):
        OffsetPaginator(limit=0)
    with pytest.raises(ConfigurationError):
        Incremental(lookback=timedelta(seconds=-1))


def test_instants_parse_from_iso_epoch_and_naive_text_as_utc() -> None:
    want = datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert parse_instant("2024-05-01T12:00:00Z") == want
    assert parse_instant("2024-05-01T14:00:00+02:00") == want
    assert parse_instant("2024-05-01T12:00:00") == want
    assert parse_instant(want.timestamp()) == want
    assert parse_instant("yesterday") is None and parse_instant(True) is None


T0 = datetime(2024, 1, 1, tzinfo=UTC)
versions = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 6)), min_size=1, max_size=30, unique=True
)


@settings(max_examples=examples(300), deadline=None)
@given(
    versions,
    st.integers(1, 4),
    st.integers(0, 3),
    st.randoms(use_true_random=False),
    st.lists(st.integers(1, 30), max_size=4),
)
def test_every_version_is_handed_on_once_whatever_the_ties_pages_and_cycles(
    vs: list[tuple[int, int]], page_size: int, lookback: int, rnd: Any, cuts: list[int]
) -> None:
    """Versions (id, second) arrive sorted by time, ties in any order, re-listed from the floor."""
    inc = Incremental(lookback=timedelta(seconds=lookback))
    # The API's history: versions become visible in time order, in batches (the cycles).
    ordered = sorted(vs, key=lambda v: (v[1], rnd.random()))
    visible: dict[int, int] = {}
    handed: list[tuple[int, int]] = []
    checkpoint: Any = None
    bounds = sorted({min(c, len(ordered)) for c in cuts} | {len(ordered)})
    start = 0
    for end in bounds:
        for rid, sec in ordered[start:end]:
            visible[rid] = max(sec, visible.get(rid, sec))
        start = end
        wm = inc.load(checkpoint)
        floor = wm.floor
        listing = sorted(
            (
                {"id": rid, "s": sec, "updated_at": (T0 + timedelta(seconds=sec)).isoformat()}
                for rid, sec in visible.items()
                if floor is None or T0 + timedelta(seconds=sec) >= floor
            ),
            key=lambda r: (r["updated_at"], rnd.random()),
        )
        for i in range(0, len(listing), page_size):
            fresh = inc.take(wm, listing[i : i + page_size])
            handed += [(r["id"], r["s"]) for r in fresh]
            checkpoint = wm.dump()
            wm = Watermark.load(json.loads(json.dumps(checkpoint)), inc.lookback)
    assert len(handed) == len(set(handed))
    assert set(visible.items()) <= set(handed)


async def test_id_cursor_paginator_pages_after_the_last_id_and_resumes_after_it() -> None:
    """Stripe's shape: ``starting_after`` = the last object's id, ``has_more``. The last
    page's checkpoint is its last id (an exclusive cursor), so the next cycle delivers
    only objects that came since, never one it handled."""
    objects = [{"id": f"o{i}"} for i in range(7)]

    def api(request: httpx.Request) -> httpx.Response:
        after = request.url.params.get("starting_after")
        start = 0 if after is None else [o["id"] for o in objects].index(after) + 1
        page = objects[start : start + 3]
        return httpx.Response(200, json={"data": page, "has_more": start + 3 < len(objects)})

    p = IdCursorPaginator()
    async with client(api) as http:
        pages = [pg async for pg in p.pages(http, "/v1/things")]
        assert [[r["id"] for r in pg.records] for pg in pages] == [
            ["o0", "o1", "o2"],
            ["o3", "o4", "o5"],
            ["o6"],
        ]
        assert [pg.checkpoint for pg in pages] == ["o2", "o5", "o6"]
        again = [pg async for pg in p.pages(http, "/v1/things", resume="o6")]
        assert [list(pg.records) for pg in again] == [[]]
        assert again[0].checkpoint == "o6"  # an empty last page keeps its own state
        objects.append({"id": "o7"})
        later = [pg async for pg in p.pages(http, "/v1/things", resume="o6")]
        assert [[r["id"] for r in pg.records] for pg in later] == [["o7"]]


async def test_the_inclusive_cursor_paginators_still_read_their_last_page_again() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params.get("page", "1"))
        return httpx.Response(200, json={"items": ITEMS[(page - 1) * 3 : page * 3]})

    _, checkpoints = await collect(PageNumberPaginator(records="items", per_page=3), api)
    assert checkpoints[-1] == 3  # the short last page, read again next time


def test_id_cursor_paginator_refuses_a_record_without_an_id() -> None:
    p = IdCursorPaginator()
    with pytest.raises(PermanentError, match="record id at 'id'"):
        p.next_state(httpx.Response(200), {"has_more": True}, [{"name": "x"}], None)
    with pytest.raises(ConfigurationError, match="take must be"):
        IdCursorPaginator(take="middle")  # type: ignore[arg-type]


async def test_next_url_paginator_stores_the_delta_link_of_the_last_page() -> None:
    """Graph's delta query: next links, then a deltaLink the next cycle starts from."""
    seen: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if "token" in request.url.params:
            return httpx.Response(
                200,
                json={"value": [{"id": 9}], "@odata.deltaLink": "https://api.test/d?token=2"},
            )
        skip = int(request.url.params.get("skip", "0"))
        body: dict[str, Any] = {"value": ITEMS[skip : skip + 4]}
        if skip + 4 < len(ITEMS):
            body["@odata.nextLink"] = f"https://api.test/d?skip={skip + 4}"
        else:
            body["@odata.deltaLink"] = "https://api.test/d?token=1"
        return httpx.Response(200, json=body)

    p = NextUrlPaginator(records="value", next="@odata.nextLink", delta="@odata.deltaLink")
    async with client(api) as http:
        pages = [pg async for pg in p.pages(http, "/d")]
        assert [pg.checkpoint for pg in pages] == [
            "https://api.test/d?skip=4",
            "https://api.test/d?token=1",
        ]
        later = [pg async for pg in p.pages(http, "/d", resume=pages[-1].checkpoint)]
    assert [[r["id"] for r in pg.records] for pg in later] == [[9]]
    assert later[-1].checkpoint == "https://api.test/d?token=2"
    assert seen[-1] == "https://api.test/d?token=1"


async def test_a_delta_link_to_another_origin_is_not_followed() -> None:
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"value": [], "@odata.deltaLink": "https://collector.example/d?t=1"}
        )

    p = NextUrlPaginator(records="value", next="@odata.nextLink", delta="@odata.deltaLink")
    with pytest.raises(PermanentError, match=r"collector\.example.*not followed"):
        await collect(p, api)


async def test_an_exclusive_cursor_paginator_resumes_from_the_last_pages_cursor() -> None:
    """Zendesk's incremental export: the last page still names the cursor after it
    (``end_of_stream``); with ``exclusive=True`` the next cycle starts there and
    delivers only what came since."""
    rows = [{"id": i} for i in range(5)]

    def api(request: httpx.Request) -> httpx.Response:
        start = int(request.url.params.get("cursor", "0"))
        page = rows[start : start + 3]
        end = start + len(page)
        return httpx.Response(200, json={"items": page, "after": str(end), "more": end < len(rows)})

    def paginator(exclusive: bool) -> CursorPaginator:
        return CursorPaginator(
            records="items", cursor="after", has_more="more", exclusive=exclusive
        )

    assert await collect(paginator(True), api) == ([[0, 1, 2], [3, 4]], ["3", "5"])
    assert (await collect(paginator(False), api))[1] == ["3", "3"]  # inclusive: re-read
    rows.append({"id": 5})
    assert (await collect(paginator(True), api, resume="5"))[0] == [[5]]


async def test_ending_before_paging_resumes_after_the_newest_and_never_redelivers() -> None:
    """Paging a newest-first list towards newer objects (``ending_before`` = the first id
    of a page): the last page's checkpoint is its newest object, so the next cycle gets
    only objects added since."""
    from synckit.testing import FakeAPI, NewestFirstList

    api = FakeAPI()
    objs = NewestFirstList("evt")
    first = objs.add(3)
    objs.mount(api, "/v1/events")
    p = IdCursorPaginator(param="ending_before", take="first")
    async with httpx.AsyncClient(base_url="https://api.test", transport=api.transport()) as http:
        start = first[0]["id"]  # the oldest: everything after it is new
        pages = [pg async for pg in p.pages(http, "/v1/events", params={"limit": 1}, resume=start)]
        assert [[r["id"] for r in pg.records] for pg in pages] == [
            [first[1]["id"]],
            [first[2]["id"]],
        ]
        newer = objs.add(2)
        later = [
            pg
            async for pg in p.pages(
                http, "/v1/events", params={"limit": 5}, resume=pages[-1].checkpoint
            )
        ]
    assert [[r["id"] for r in pg.records] for pg in later] == [[newer[1]["id"], newer[0]["id"]]]

"""A connector built on the paging and incremental helpers, against a live-changing fake API.

The API lists tickets changed since an inclusive ``since``, sorted by ``updated_at`` with
ties in *descending* id order (so a watermark compared as a plain ``(updated_at, id)``
tuple would drop records), three a page, behind keyset cursors that the test can expire
(410). Records are updated and inserted between pages, some sharing the watermark's
timestamp, some written late behind it. The same scenario runs with the helpers and
with a hand-written connector of the same behaviour; both must hand every final version
to ``handle()`` and no version twice, and the helper one must be shorter.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import httpx
import pytest

from synckit import App, Connector, CursorPaginator, Incremental, Page, SyncContext
from synckit.errors import ErrorClass
from synckit.errors.exceptions import PermanentError
from synckit.store.db import Database

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


class TicketApi:
    """``GET /tickets?since=&cursor=&limit=``: keyset cursors kept server-side."""

    def __init__(self) -> None:
        self.rows: dict[int, str] = {}
        self.cursors: dict[str, tuple[str, int]] = {}
        self.requests = 0
        self.script: dict[int, Callable[[TicketApi], None]] = {}
        self.expired = 0

    def put(self, rid: int, seconds: int) -> None:
        self.rows[rid] = at(seconds)

    def expire_cursors(self) -> None:
        self.cursors.clear()

    @staticmethod
    def _key(rid: int, updated: str) -> tuple[str, int]:
        return (updated, -rid)  # ties by id descending

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if hook := self.script.pop(self.requests, None):
            hook(self)
        q = request.url.params
        limit = int(q.get("limit", "3"))
        after: tuple[str, int] | None = None
        since = q.get("since")
        if "cursor" in q:
            if q["cursor"] not in self.cursors:
                self.expired += 1
                return httpx.Response(410, json={"error": "cursor expired"})
            after = self.cursors[q["cursor"]]
        rows = sorted(
            (self._key(rid, u), rid, u)
            for rid, u in self.rows.items()
            if since is None or u >= since
        )
        if after is not None:
            rows = [r for r in rows if r[0] > after]
        page, rest = rows[:limit], rows[limit:]
        token = None
        if rest:
            token = f"c{self.requests}"
            self.cursors[token] = page[-1][0]
        return httpx.Response(
            200,
            json={
                "tickets": [{"id": str(rid), "updated_at": u} for _, rid, u in page],
                "next_cursor": token,
            },
        )


HANDLED: list[tuple[str, str]] = []


class HelperTickets(Connector):
    name = "tickets_helpers"
    base_url = "https://tickets.test"
    paginator = CursorPaginator(records="tickets", cursor="next_cursor")
    incremental = Incremental("updated_at", lookback=timedelta(seconds=30))

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        async for page in self.incremental.pages(
            ctx.http, "/tickets", self.paginator, checkpoint, params={"limit": 3}
        ):
            yield page

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        HANDLED.append((record["id"], record["updated_at"]))


class HandWrittenTickets(Connector):
    name = "tickets_by_hand"
    base_url = "https://tickets.test"
    lookback: ClassVar[timedelta] = timedelta(seconds=30)

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        state = checkpoint or {"high": None, "seen": {}, "cursor": None, "since": None}
        restarts = 0
        while True:
            if state["cursor"] is None and state["high"] is not None:
                floor = datetime.fromisoformat(state["high"][0]) - self.lookback
                state["since"] = floor.isoformat().replace("+00:00", "Z")
            params: dict[str, Any] = {"limit": 3}
            if state["since"]:
                params["since"] = state["since"]
            if state["cursor"]:
                params["cursor"] = state["cursor"]
            try:
                body = (await ctx.http.get("/tickets", params=params)).json()
            except PermanentError as exc:
                gone = getattr(exc, "classification", None)
                if state["cursor"] is None or restarts >= 3 or gone is None:
                    raise
                if gone.error_class is not ErrorClass.NOT_FOUND:
                    raise
                restarts += 1
                state["cursor"] = None
                continue
            fresh = []
            for record in body["tickets"]:
                updated = datetime.fromisoformat(record["updated_at"])
                rid = str(record["id"])
                if state["high"] is not None:
                    floor = datetime.fromisoformat(state["high"][0]) - self.lookback
                    if updated < floor:
                        continue
                before = state["seen"].get(rid)
                if before is not None and datetime.fromisoformat(before) >= updated:
                    continue
                fresh.append(record)
                state["seen"][rid] = record["updated_at"]
                if state["high"] is None or (updated, rid) > (
                    datetime.fromisoformat(state["high"][0]),
                    state["high"][1],
                ):
                    state["high"] = [record["updated_at"], rid]
            if state["high"] is not None:
                floor = datetime.fromisoformat(state["high"][0]) - self.lookback
                state["seen"] = {
                    k: v for k, v in state["seen"].items() if datetime.fromisoformat(v) >= floor
                }
            state["cursor"] = body["next_cursor"]
            yield Page(fresh, checkpoint=dict(state))
            if state["cursor"] is None:
                return

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        HANDLED.append((record["id"], record["updated_at"]))


def scenario() -> TicketApi:
    api = TicketApi()
    # Ten tickets, ties at 10 s and 20 s that straddle the three-record pages.
    for rid, seconds in [
        (1, 5),
        (2, 10),
        (3, 10),
        (4, 10),
        (5, 10),
        (6, 20),
        (7, 20),
        (8, 20),
        (9, 25),
        (10, 30),
    ]:
        api.put(rid, seconds)
    return api


def lost_and_repeated(api: TicketApi) -> tuple[set[tuple[str, str]], list[tuple[str, str]]]:
    final = {(str(rid), u) for rid, u in api.rows.items()}
    lost = final - set(HANDLED)
    repeated = [v for v in set(HANDLED) if HANDLED.count(v) > 1]
    return lost, repeated


@pytest.mark.parametrize("connector", [HelperTickets, HandWrittenTickets])
async def test_changes_between_pages_and_an_expired_cursor_lose_and_repeat_nothing(
    db: Database, connector: type[Connector[Any]]
) -> None:
    HANDLED.clear()
    api = scenario()
    app = App([connector], transport=httpx.MockTransport(api.handler))
    await app.add_tenant(db, "acme", connector.name)

    # Cycle 1: a full listing, while records change between its pages.
    def mid_first(a: TicketApi) -> None:
        a.put(2, 40)  # updated: moves behind the cursor, listed again later
        a.put(11, 10)  # a tie of a page already read, written late: the lookback finds it

    api.script[2] = mid_first
    first = await app.poll(db, "acme")
    assert first.pages >= 4

    # Cycle 2: the stored watermark, a tie at it written late, and the cursor expiring
    # between the second and third pages.
    api.put(12, 40)  # same timestamp as the watermark
    api.put(13, 15)  # written late, within the 30 s lookback
    api.put(3, 45)

    def mid_second(a: TicketApi) -> None:
        a.put(14, 45)
        a.put(15, 50)
        a.put(16, 50)
        a.put(17, 51)
        a.expire_cursors()

    start = api.requests
    api.script[start + 2] = mid_second
    for rid, seconds in [(18, 41), (19, 42), (20, 43)]:
        api.put(rid, seconds)
    await app.poll(db, "acme")
    assert api.expired == 1

    # Cycle 3: nothing changed, nothing handled.
    before = len(HANDLED)
    await app.poll(db, "acme")
    assert len(HANDLED) == before

    lost, repeated = lost_and_repeated(api)
    assert not lost, f"lost: {sorted(lost)}"
    assert not repeated, f"handled twice: {sorted(repeated)}"


def test_a_plain_tuple_watermark_would_lose_the_descending_ties() -> None:
    """The scenario is hard enough: ties come in descending id order across pages."""
    api = scenario()
    first = api.handler(httpx.Request("GET", "https://tickets.test/tickets?limit=3")).json()
    ids = [t["id"] for t in first["tickets"]]
    assert ids == ["1", "5", "4"]  # then 3 and 2 at the same 10 s: below ("10", "4")


def test_the_connector_with_helpers_is_shorter() -> None:
    with_helpers = len(inspect.getsource(HelperTickets).splitlines())
    by_hand = len(inspect.getsource(HandWrittenTickets).splitlines())
    print(f"connector lines: with helpers {with_helpers}, by hand {by_hand}")
    assert with_helpers * 3 < by_hand

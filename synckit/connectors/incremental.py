"""Incremental sync by an ``(updated_at, id)`` watermark, as a small object a connector declares.

Most REST APIs offer "records changed since T", with ``T`` *inclusive*, sorted by update
time: oldest first (a "since" endpoint) or newest first (Stripe's lists, GitHub's events,
most audit logs). Getting that right is fiddly: records sharing an ``updated_at`` fall on
both sides of a page boundary (and of a cycle boundary), late writers commit a record
whose ``updated_at`` is already behind the watermark, a cursor kept between pages expires
(``410 Gone``), and a newest-first listing may only move the watermark once it has been
walked down to the old one. :class:`Incremental` does it once::

    class Tickets(Connector[TicketsConfig]):
        paginator = CursorPaginator(records="tickets", cursor="next_cursor")
        incremental = Incremental("updated_at", since_param="updated_since")

        async def poll(self, ctx, checkpoint):
            async for page in self.incremental.pages(
                ctx, "/tickets", self.paginator, checkpoint
            ):
                yield page

The listing's order is ``order="auto"`` by default: the first two distinct
``updated_at`` values of a listing say whether it is ascending or descending, and the
stream keeps that order in its checkpoint; ``"ascending"`` or ``"descending"`` declares it.
A listing whose ``updated_at`` goes both up and down (or against the declared order) raises
:class:`ListingOrderError` naming the stream: it is never handed on as a quiet success.

What it guarantees, for an API that returns records sorted by ``updated_at`` (either way;
ties in any order) and an inclusive ``since``:

* every version of a record (``id`` at one ``updated_at``) is handed to ``handle()`` once:
  records already seen at the same or a later ``updated_at`` are filtered out, however
  the ties fall across pages, cycles and restarts;
* ascending: the watermark moves with every page; records below ``watermark - lookback``
  can only be repeats and are dropped;
* descending: the listing is walked from the top down to ``watermark - lookback`` (the
  first record below it ends the walk: no page past it is fetched); the newest record
  seen becomes the next watermark's bound only once the walk is over. A checkpoint taken
  mid-walk holds the walk's floor (the old watermark), its bottom and the ids at the
  bottom, so a cycle that dies mid-walk resumes where it was and still walks down to the
  old watermark, and one whose paging cursor expired walks again from the top, skipping
  what it already walked;
* the query asks for ``since = watermark - lookback``, so a record written late, up to
  ``lookback`` behind the watermark, is still found (and not repeated: the ids seen within
  the lookback window are kept in the checkpoint, so keep ``lookback`` short);
* a stored paging cursor the API no longer knows (``404``/``410``, ``not_found`` to
  synckit) restarts the listing, a few times per cycle at most;
* the checkpoint after each page (JSON) holds the watermark, the ids at it and, mid-run,
  the paging state, so a cycle that dies resumes at the page it was on.

A record without a parsable ``updated_at`` or ``id`` is passed on (``handle()`` decides
what it is) but does not move the watermark and is not checked for order.

For event feeds listed newest first and paged by object id (Stripe's ``/v1/events``), where
events should be handled oldest first once caught up, see :class:`NewestFirstFeed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
import structlog

from synckit.connectors.base import Page
from synckit.connectors.context import SyncContext
from synckit.connectors.paging import Fetched, IdCursorPaginator, Paginator, json_path
from synckit.errors.classify import ErrorClass
from synckit.errors.exceptions import ConfigurationError, ListingOrderError, PermanentError

__all__ = [
    "Incremental",
    "ListingOrder",
    "NewestFirstFeed",
    "Watermark",
    "parse_instant",
]

log = structlog.get_logger("synckit.incremental")

#: How a listing is sorted by ``updated_at``; ``auto``: found from the listing itself.
ListingOrder = Literal["ascending", "descending", "auto"]
_ORDERS = ("ascending", "descending", "auto")


def parse_instant(value: Any) -> datetime | None:
    """An aware UTC datetime from ISO 8601 text, epoch seconds or a datetime; else None.

    Text without an offset is taken as UTC, which is what APIs that omit it mean.
    """
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, bool):
        return None
    elif isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    else:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def iso_z(moment: datetime) -> str:
    """``2024-05-01T10:00:00Z``: the ISO form nearly every API accepts."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else iso_z(moment)


@dataclass
class Watermark:
    """The state of one stream's incremental sync; :meth:`dump` is its checkpoint.

    ``high`` is the greatest ``(updated_at, id)`` handed on; ``seen`` the ids handed on
    within ``lookback`` of it, with their ``updated_at``; ``resume`` the paging state of a
    listing in progress, and ``since`` the lower bound (the floor) that listing walks to.
    ``order`` is the stream's listing order once declared or found. While a listing is in
    progress, ``last`` is the ``updated_at`` of its last placed record (the order check
    across pages) and, unless the order is ascending, ``bottom`` the lowest ``updated_at``
    handed on in it and ``edge`` the ids handed on at ``bottom``. ``reached`` is set by
    :meth:`take` when a descending listing went below its floor: the walk is over.

    A listing is :meth:`begin`, :meth:`take` per page, :meth:`finish`;
    :meth:`Incremental.pages` does that.
    """

    lookback: timedelta
    high: tuple[datetime, str] | None = None
    seen: dict[str, datetime] = field(default_factory=dict)
    resume: Any = None
    since: datetime | None = None
    order: Literal["ascending", "descending"] | None = None
    last: datetime | None = None
    bottom: datetime | None = None
    edge: set[str] = field(default_factory=set)
    reached: bool = False

    @classmethod
    def load(cls, checkpoint: Any, lookback: timedelta) -> Watermark:
        wm = cls(lookback)
        if not isinstance(checkpoint, Mapping):
            return wm  # none yet (or a checkpoint of another shape: start over)
        high = checkpoint.get("high")
        if isinstance(high, list | tuple) and len(high) == 2:
            at = parse_instant(high[0])
            if at is not None:
                wm.high = (at, str(high[1]))
        seen = checkpoint.get("seen")
        if isinstance(seen, Mapping):
            for rid, text in seen.items():
                at = parse_instant(text)
                if at is not None:
                    wm.seen[str(rid)] = at
        wm.resume = checkpoint.get("resume")
        wm.since = parse_instant(checkpoint.get("since"))
        order = checkpoint.get("order")
        if order in ("ascending", "descending"):
            wm.order = order
        wm.last = parse_instant(checkpoint.get("last"))
        wm.bottom = parse_instant(checkpoint.get("bottom"))
        edge = checkpoint.get("edge")
        if isinstance(edge, list):
            wm.edge = {str(rid) for rid in edge}
        return wm

    @property
    def floor(self) -> datetime | None:
        """The lower bound of the next listing: the watermark minus the lookback."""
        return None if self.high is None else self.high[0] - self.lookback

    def begin(self) -> None:
        """Start a listing: its floor is the watermark minus the lookback, as of now."""
        self.resume = None
        self.since = self.floor
        self.last = None
        self.bottom = None
        self.edge = set()
        self.reached = False

    def restart(self) -> None:
        """Start the listing in progress again from its first page (an expired cursor).

        Ascending, it restarts from the watermark as it has moved; otherwise the floor
        stays the one the listing began with, and what was walked is skipped again
        (``bottom``, ``edge``).
        """
        self.resume = None
        self.last = None
        if self.order == "ascending":
            self.since = self.floor
        elif self.order is None:
            # All handed on so far share one updated_at and are in ``seen``: the listing
            # from the top is walked afresh (a bottom kept would skip records above it
            # that no page has shown yet).
            self.bottom, self.edge = None, set()

    def finish(self) -> None:
        """End the listing in progress: the watermark is the newest record handed on."""
        self.resume = None
        self.since = None
        self.last = None
        self.bottom = None
        self.edge = set()
        self.reached = False
        self._trim(self.floor)

    def take(
        self,
        records: Iterable[Any],
        updated_at: str,
        id_field: str,
        *,
        order: ListingOrder = "auto",
        where: str = "listing",
    ) -> list[Any]:
        """The records not handed on before, in order; the watermark moves past them.

        Raises :class:`ListingOrderError` (its message starting with ``where``) when the
        page's ``updated_at`` values, with the listing's before them, are not in one order.
        """
        placed: list[tuple[Any, datetime | None, str]] = []
        for record in records:
            at = parse_instant(json_path(record, updated_at))
            raw_id = json_path(record, id_field)
            if at is None or raw_id is None or isinstance(raw_id, dict | list):
                placed.append((record, None, ""))  # cannot be placed: handle() decides
            else:
                placed.append((record, at, str(raw_id)))
        self._check_order([at for _, at, _ in placed if at is not None], updated_at, order, where)
        descending = self.order == "descending"
        track = self.order != "ascending"
        fresh: list[Any] = []
        for record, at, rid in placed:
            if at is None:
                fresh.append(record)
                continue
            if descending:
                if self.since is not None and at < self.since:
                    self.reached = True  # below the old watermark: the walk is over
                    break
                if self.bottom is not None and (
                    at > self.bottom or (at == self.bottom and rid in self.edge)
                ):
                    continue  # walked already (an expired cursor restarted the walk)
            else:
                floor = self.floor
                if floor is not None and at < floor:
                    continue
            before = self.seen.get(rid)
            if before is not None and before >= at:
                continue
            fresh.append(record)
            if track:
                if self.bottom is None or at < self.bottom:
                    self.bottom, self.edge = at, {rid}
                elif at == self.bottom:
                    self.edge.add(rid)
            if self.high is None or (at, rid) > self.high:
                self.high = (at, rid)
            if at >= self.high[0] - self.lookback:
                self.seen[rid] = at
        if self.order != "ascending":
            # Mid-walk (or while the order is unknown), the ids handed on down to the
            # walk's floor are still needed: the walk may meet them again. (Only ids
            # within the lookback of the watermark are added, so this stays small.)
            floor = self.floor
            if self.since is not None and floor is not None:
                self._trim(min(floor, self.since))
        else:
            self._trim(self.floor)
        return fresh

    def _check_order(
        self, keys: Sequence[datetime], updated_at: str, declared: ListingOrder, where: str
    ) -> None:
        # Across pages only within a listing in progress (a caller of take() alone pages
        # with resume left None: each call is checked on its own).
        prev = self.last if self.resume is not None else None
        for at in keys:
            if prev is not None and at != prev:
                step: Literal["ascending", "descending"] = (
                    "ascending" if at > prev else "descending"
                )
                expected = self.order if declared == "auto" else declared
                if expected is None:
                    self._found(step)
                elif step != expected:
                    how = "declared" if declared != "auto" else "found from its first values"
                    raise ListingOrderError(
                        f"{where} is not sorted by {updated_at!r}: {iso_z(at)} came after "
                        f"{iso_z(prev)} in a listing {expected} ({how}); records would be "
                        "skipped, so none are taken (fix the query's sort, or declare "
                        "Incremental(order=...) to match it)"
                    )
            prev = at
        self.last = prev if prev is not None else self.last

    def _found(self, order: Literal["ascending", "descending"]) -> None:
        self.order = order
        if order == "ascending":
            self.bottom, self.edge = None, set()

    def _trim(self, floor: datetime | None) -> None:
        if floor is not None:
            self.seen = {rid: at for rid, at in self.seen.items() if at >= floor}

    def dump(self) -> dict[str, Any]:
        """The checkpoint: JSON, and :meth:`load` reads it back."""
        out: dict[str, Any] = {
            "high": None if self.high is None else [iso_z(self.high[0]), self.high[1]],
            "seen": {rid: iso_z(at) for rid, at in sorted(self.seen.items())},
            "resume": self.resume,
            "since": _iso_or_none(self.since),
        }
        if self.order is not None:
            out["order"] = self.order
        if self.resume is not None:
            out["last"] = _iso_or_none(self.last)
            if self.bottom is not None:
                out["bottom"] = iso_z(self.bottom)
                out["edge"] = sorted(self.edge)
        return out


def _cursor_gone(exc: BaseException) -> bool:
    classification = getattr(exc, "classification", None)
    return getattr(classification, "error_class", None) is ErrorClass.NOT_FOUND


def _client(source: httpx.AsyncClient | SyncContext) -> tuple[httpx.AsyncClient, str]:
    """The client, and how an error names the stream (``ctx`` knows it)."""
    if isinstance(source, SyncContext):
        return source.http, f"stream {source.stream!r} of connector {source.connector_name!r}: "
    return source, ""


@dataclass(frozen=True)
class Incremental:
    """An ``(updated_at, id)`` watermark over a paginated "changed since" listing.

    ``updated_at`` and ``id`` are dotted paths into a record. ``order`` is the listing's
    sort by ``updated_at``: ``"ascending"``, ``"descending"`` (newest first) or ``"auto"``
    (found from the first two distinct values, then kept). ``since_param`` is the query
    parameter of the inclusive lower bound (None: the API takes none, and the filtering
    alone avoids repeats), formatted by ``since_format`` (ISO 8601 with ``Z``).
    ``lookback`` widens each listing backwards for records written late.
    ``max_restarts`` bounds the restarts of one cycle on an expired paging cursor.
    """

    updated_at: str = "updated_at"
    id: str = "id"
    since_param: str | None = "since"
    lookback: timedelta = timedelta(0)
    since_format: Callable[[datetime], str] = iso_z
    max_restarts: int = 3
    order: ListingOrder = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.lookback, timedelta) or self.lookback < timedelta(0):
            raise ConfigurationError("Incremental.lookback must be a non-negative timedelta")
        if self.max_restarts < 0:
            raise ConfigurationError("Incremental.max_restarts must be at least 0")
        if self.order not in _ORDERS:
            raise ConfigurationError(
                f"Incremental.order must be one of {', '.join(_ORDERS)}, not {self.order!r}"
            )

    def load(self, checkpoint: Any) -> Watermark:
        """The watermark stored in ``checkpoint`` (a fresh one for None)."""
        wm = Watermark.load(checkpoint, self.lookback)
        if self.order != "auto" and wm.order != self.order:
            wm.order = self.order
            if self.order == "ascending":
                wm.bottom, wm.edge = None, set()
        return wm

    def take(self, wm: Watermark, records: Sequence[Any], *, where: str = "listing") -> list[Any]:
        """The records of ``records`` not handed on before; ``wm`` moves past them.

        A caller paging by itself brackets a listing with ``wm.begin()`` and
        ``wm.finish()`` (needed for descending listings), and stops fetching once
        ``wm.reached`` is set.
        """
        return wm.take(records, self.updated_at, self.id, order=self.order, where=where)

    async def pages(
        self,
        http: httpx.AsyncClient | SyncContext,
        url: str,
        paginator: Paginator,
        checkpoint: Any,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Page]:
        """The new records of the listing at ``url``, a page at a time, with checkpoints.

        ``http`` is the hook's ``ctx`` (an error then names the stream) or a client. The
        last page of a listing (or, descending, the page that reached the old watermark)
        stores the watermark without paging state, so the next cycle asks for
        ``since = watermark - lookback``.
        """
        client, stream = _client(http)
        where = f"{stream}listing {url}"
        wm = self.load(checkpoint)
        restarts = 0
        if wm.resume is None:
            wm.begin()
        while True:
            query = dict(params or {})
            if self.since_param is not None and wm.since is not None:
                query[self.since_param] = self.since_format(wm.since)
            try:
                async for fetched in paginator.fetch(
                    client, url, params=query, headers=headers, resume=wm.resume
                ):
                    fresh = self.take(wm, fetched.records, where=where)
                    wm.resume = fetched.next
                    if wm.resume is None or wm.reached:
                        wm.finish()
                        yield Page(fresh, checkpoint=wm.dump())
                        return
                    yield Page(fresh, checkpoint=wm.dump())
                wm.finish()
                return
            except PermanentError as exc:
                if (
                    isinstance(exc, ListingOrderError)
                    or wm.resume is None
                    or not _cursor_gone(exc)
                    or restarts >= self.max_restarts
                ):
                    raise
                restarts += 1
                wm.restart()
                log.warning(
                    "incremental.cursor_expired",
                    url=url,
                    restart_from=_iso_or_none(wm.since),
                    error=str(exc)[:200],
                )


def _ids_at(records: Sequence[tuple[Any, datetime | None, str]], at: datetime) -> set[str]:
    return {rid for _, c, rid in records if c == at}


@dataclass(frozen=True)
class NewestFirstFeed:
    """An event feed listed newest first and paged by object id (Stripe's ``/v1/events``).

    The first cycle walks the feed down from the newest event (``starting_after`` = the
    last id of a page) and hands every event on, newest first: a backfill. The newest
    event handed on is then the feed's position, and every later cycle *catches up* from
    it towards newer events (``ending_before`` = the newest id), handing them on oldest
    first, the position moving with every page: each page's checkpoint is exact, so a
    cycle that dies resumes without loss or repeat.

    When the stored position is gone (the API answers ``404``/``410``, ``not_found`` to
    synckit, as Stripe does for an event past its 30-day retention or an id it does not
    know), the feed *resyncs*: it walks down again from the newest event to the position's
    ``created`` time (or fully, with ``created=None``), skipping the events at that time
    that it handed on before. A walk in progress is kept in the checkpoint the same way,
    so a walk that dies resumes where it was.

    ``records``, ``id``, ``created`` (a dotted path to the event's creation time, epoch
    seconds or ISO 8601) and ``has_more`` are paths into the body and its records;
    ``after_param`` / ``before_param`` the API's two id cursors; ``limit`` the page size
    asked for with ``limit_param`` (None: the API's default).
    """

    records: str = "data"
    id: str = "id"
    created: str | None = "created"
    has_more: str = "has_more"
    after_param: str = "starting_after"
    before_param: str = "ending_before"
    limit: int | None = 100
    limit_param: str = "limit"
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ConfigurationError("NewestFirstFeed.limit must be at least 1 (or None)")
        if self.max_restarts < 0:
            raise ConfigurationError("NewestFirstFeed.max_restarts must be at least 0")

    def _paginator(self, *, down: bool) -> Paginator:
        return IdCursorPaginator(
            records=self.records,
            id=self.id,
            param=self.after_param if down else self.before_param,
            has_more=self.has_more,
            take="last" if down else "first",
        )

    def _placed(self, records: Sequence[Any]) -> list[tuple[Any, datetime | None, str]]:
        out = []
        for record in records:
            raw = json_path(record, self.id)
            rid = "" if raw is None or isinstance(raw, dict | list) else str(raw)
            at = None if self.created is None else parse_instant(json_path(record, self.created))
            out.append((record, at, rid))
        return out

    async def pages(
        self,
        http: httpx.AsyncClient | SyncContext,
        url: str,
        checkpoint: Any,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Page]:
        """The new events of the feed at ``url``, a page at a time, with checkpoints."""
        client, stream = _client(http)
        state = _FeedState.load(checkpoint)
        query = dict(params or {})
        if self.limit is not None:
            query[self.limit_param] = self.limit
        restarts = 0
        while True:
            try:
                if state.walk is not None or state.newest is None:
                    if state.walk is None:
                        state.walk = _Walk()
                    down = self._paginator(down=True).fetch(
                        client, url, params=query, headers=headers, resume=state.walk.after
                    )
                    async for page in self._walk_down(state, down):
                        yield page
                    return
                up = self._paginator(down=False).fetch(
                    client, url, params=query, headers=headers, resume=state.newest
                )
                async for page in self._catch_up(state, up):
                    yield page
                return
            except PermanentError as exc:
                if not _cursor_gone(exc) or restarts >= self.max_restarts:
                    raise
                restarts += 1
                if state.walk is None:
                    log.warning(
                        "feed.resync",
                        url=url,
                        stream=stream or None,
                        position=state.newest,
                        walk_to=_iso_or_none(state.newest_at),
                        error=str(exc)[:200],
                    )
                    state.walk = _Walk()
                else:
                    if state.walk.after is None:
                        raise  # the first page of a walk is gone: nothing to restart
                    log.warning("feed.walk_restarted", url=url, error=str(exc)[:200])
                    state.walk.after = None

    async def _walk_down(
        self, state: _FeedState, pages: AsyncIterator[Fetched]
    ) -> AsyncIterator[Page]:
        """The walk down the feed (``pages``, read from the walk's ``after``)."""
        walk = state.walk
        assert walk is not None
        async for fetched in pages:
            fresh: list[Any] = []
            reached = False
            for record, at, rid in self._placed(fetched.records):
                if rid and rid == state.newest:
                    reached = True  # the position itself: everything below was handed
                    break
                if at is not None and state.newest_at is not None:
                    if at < state.newest_at:
                        reached = True
                        break
                    if at == state.newest_at and rid in state.at_newest:
                        continue
                if (
                    at is not None
                    and walk.bottom is not None
                    and (at > walk.bottom or (at == walk.bottom and rid in walk.edge))
                ):
                    continue  # walked before an expired cursor restarted the walk
                fresh.append(record)
                if walk.top is None and rid:
                    walk.top, walk.top_at, walk.top_ids = rid, at, {rid}
                elif at is not None and at == walk.top_at:
                    walk.top_ids.add(rid)
                if at is not None:
                    if walk.bottom is None or at < walk.bottom:
                        walk.bottom, walk.edge = at, {rid}
                    elif at == walk.bottom:
                        walk.edge.add(rid)
            if fetched.records:
                walk.after = str(json_path(fetched.records[-1], self.id))
            if reached or fetched.next is None:
                state.commit_walk()
                yield Page(fresh, checkpoint=state.dump())
                return
            yield Page(fresh, checkpoint=state.dump())
        state.commit_walk()

    async def _catch_up(
        self, state: _FeedState, pages: AsyncIterator[Fetched]
    ) -> AsyncIterator[Page]:
        """The events the feed added since the position (``pages``, read from it)."""
        async for fetched in pages:
            placed = self._placed(fetched.records)
            fresh = [r for r, _, rid in reversed(placed) if not rid or rid != state.newest]
            if placed and placed[0][2]:
                _, at, rid = placed[0]
                same = state.newest_at is not None and at == state.newest_at
                ids = _ids_at(placed, at) if at is not None else {rid}
                state.at_newest = (state.at_newest | ids) if same else ids
                state.newest, state.newest_at = rid, at
            yield Page(fresh, checkpoint=state.dump())


@dataclass
class _Walk:
    after: str | None = None
    top: str | None = None
    top_at: datetime | None = None
    top_ids: set[str] = field(default_factory=set)
    bottom: datetime | None = None
    edge: set[str] = field(default_factory=set)


@dataclass
class _FeedState:
    """A :class:`NewestFirstFeed`'s checkpoint: the position (the newest event handed on,
    its time and the ids handed at that time) and, during a walk down, the walk."""

    newest: str | None = None
    newest_at: datetime | None = None
    at_newest: set[str] = field(default_factory=set)
    walk: _Walk | None = None

    @classmethod
    def load(cls, checkpoint: Any) -> _FeedState:
        state = cls()
        if not isinstance(checkpoint, Mapping):
            return state
        newest = checkpoint.get("newest")
        state.newest = None if newest is None else str(newest)
        state.newest_at = parse_instant(checkpoint.get("newest_at"))
        state.at_newest = {str(i) for i in checkpoint.get("at_newest") or ()}
        walk = checkpoint.get("walk")
        if isinstance(walk, Mapping):
            after, top = walk.get("after"), walk.get("top")
            state.walk = _Walk(
                after=None if after is None else str(after),
                top=None if top is None else str(top),
                top_at=parse_instant(walk.get("top_at")),
                top_ids={str(i) for i in walk.get("top_ids") or ()},
                bottom=parse_instant(walk.get("bottom")),
                edge={str(i) for i in walk.get("edge") or ()},
            )
        return state

    def commit_walk(self) -> None:
        """The walk is over: its newest event is the position (if it handed any)."""
        walk, self.walk = self.walk, None
        if walk is None or walk.top is None:
            return
        if self.newest_at is not None and walk.top_at == self.newest_at:
            self.at_newest |= walk.top_ids
        else:
            self.at_newest = set(walk.top_ids)
        self.newest, self.newest_at = walk.top, walk.top_at

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "newest": self.newest,
            "newest_at": _iso_or_none(self.newest_at),
            "at_newest": sorted(self.at_newest),
        }
        if self.walk is not None:
            w = self.walk
            out["walk"] = {
                "after": w.after,
                "top": w.top,
                "top_at": _iso_or_none(w.top_at),
                "top_ids": sorted(w.top_ids),
                "bottom": _iso_or_none(w.bottom),
                "edge": sorted(w.edge),
            }
        return out

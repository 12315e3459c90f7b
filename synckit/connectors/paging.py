"""Paginators: the paging loop of a REST API as a small object a connector declares.

Six shapes cover most APIs (Singer, Airbyte's declarative paginators, dlt's
``RESTClient`` and Nango ship the same five, and Stripe the sixth):

=============================  ==============================================================
:class:`CursorPaginator`       the body carries an opaque cursor, sent back as a parameter
:class:`IdCursorPaginator`     the last record's id, sent back (``starting_after``, Stripe)
:class:`NextUrlPaginator`      the body carries the next page's URL (``@odata.nextLink``),
                               and the last page may carry a delta link (``@odata.deltaLink``)
:class:`LinkHeaderPaginator`   the ``Link: <...>; rel="next"`` header (GitHub, GitLab)
:class:`OffsetPaginator`       ``offset`` / ``limit`` parameters
:class:`PageNumberPaginator`   ``page`` (and ``per_page``) parameters
=============================  ==============================================================

Each one reads the records of a page at ``records`` (a dotted path into the JSON body,
``""`` for a body that is the list itself) and knows where the next page is. The state
that fetches a page (a cursor, a URL, an offset, a page number) is plain JSON, so it is
what a checkpoint stores::

    class Tickets(Connector[TicketsConfig]):
        paginator = CursorPaginator(records="tickets", cursor="next_cursor")

        async def poll(self, ctx, checkpoint):
            async for page in self.paginator.pages(ctx.http, "/tickets", resume=checkpoint):
                yield page

:meth:`Paginator.pages` yields :class:`~synckit.connectors.base.Page` objects whose
checkpoint resumes at the next page, and, on the last page, resumes at its tail next time
(the tail of a list is where new records appear): a paginator with an *exclusive* cursor
(:class:`IdCursorPaginator`: after the last record's id; a delta link) resumes after the
last record, so nothing handled is delivered again; the others re-read the last page.
:meth:`Paginator.fetch` yields :class:`Fetched` pages for callers that need more (the
body; the incremental helper in :mod:`synckit.connectors.incremental`).

The requests go through the client given, so with ``ctx.http`` a failed page raises what
the runtime acts on (a 429 paces the tenant, a 410 is ``not_found``...). A body that is
not what the paginator was declared for (no list at ``records``, a cursor that does not
change) raises :class:`~synckit.errors.exceptions.PermanentError` naming the problem.

A next-page URL an API sends (:class:`NextUrlPaginator`, :class:`LinkHeaderPaginator`) is
followed only on the origin (scheme, host, port) of the page that named it: the client
sends the tenant's credentials with every request, and a hostile, compromised or
misconfigured API must not be able to send them elsewhere by naming another host, or
plain ``http``. A connector whose API really pages across hosts says so with
``other_origins=True``.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from synckit.connectors.base import Page
from synckit.errors.exceptions import ConfigurationError, PermanentError

__all__ = [
    "CursorPaginator",
    "Fetched",
    "IdCursorPaginator",
    "LinkHeaderPaginator",
    "NextUrlPaginator",
    "OffsetPaginator",
    "PageNumberPaginator",
    "Paginator",
    "json_path",
]

#: Where the records of a page are: a dotted path into the body, or a function of it.
RecordsAt = str | Callable[[Any], Any]


def json_path(body: Any, path: str) -> Any:
    """``body["a"]["b"]`` for ``"a.b"`` (``""``: the body); None where a step is missing.

    A key that itself holds dots (``@odata.nextLink``) is found as it is.
    """
    if not path:
        return body
    if isinstance(body, Mapping):
        if path in body:
            return body[path]
        head, _, rest = path.partition(".")
        return json_path(body[head], rest) if rest and head in body else None
    if isinstance(body, list):
        head, _, rest = path.partition(".")
        if head.lstrip("-").isdigit() and -len(body) <= int(head) < len(body):
            return json_path(body[int(head)], rest)
    return None


@dataclass(frozen=True)
class Fetched:
    """One page as fetched: its records, the state that fetched it, the state of the next.

    ``state`` and ``next`` are JSON (None: the first page / there is no next page);
    ``tail``, on the last page, the state a later listing resumes from (see
    :meth:`Paginator.tail_state`).
    """

    records: Sequence[Any]
    state: Any
    next: Any
    response: httpx.Response
    body: Any
    tail: Any = None


class Paginator(ABC):
    """How one API pages. Subclasses say how a state becomes a request, and what's next."""

    def __init__(self, *, records: RecordsAt = "", max_pages: int | None = None) -> None:
        if not (isinstance(records, str) or callable(records)):
            raise ConfigurationError("records must be a dotted path or a function of the body")
        if max_pages is not None and max_pages < 1:
            raise ConfigurationError("max_pages must be at least 1 (or None)")
        self.records = records
        self.max_pages = max_pages

    @abstractmethod
    def request(self, url: str, params: dict[str, Any], state: Any) -> tuple[str, dict[str, Any]]:
        """The URL and query parameters that fetch the page of ``state`` (None: the first)."""

    @abstractmethod
    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        """The state of the page after this one, or None when this was the last."""

    def tail_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        """The state a later listing resumes from, after the last page (this one).

        Default ``state``: the last page is read again (its cursor is inclusive). A
        paginator whose cursor is exclusive returns the state *after* the page's last
        record, so a resumed listing delivers only records that came since.
        """
        return state

    def records_of(self, body: Any) -> Sequence[Any]:
        found = self.records(body) if callable(self.records) else json_path(body, self.records)
        if not isinstance(found, list):
            where = self.records if isinstance(self.records, str) else "records()"
            raise PermanentError(
                f"page body has no list of records at {where or 'the top level'!r} "
                f"(found {type(found).__name__})"
            )
        return found

    async def fetch(
        self,
        http: httpx.AsyncClient,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        resume: Any = None,
    ) -> AsyncIterator[Fetched]:
        """Fetch pages from ``resume`` (None: the first page) until the last one."""
        state = resume
        for count in itertools.count(1):
            page_url, page_params = self.request(url, dict(params or {}), state)
            response = await http.get(page_url, params=page_params or None, headers=headers)
            try:
                body = response.json()
            except ValueError as exc:
                raise PermanentError(
                    f"page of {url} is not JSON ({response.headers.get('content-type')})"
                ) from exc
            records = self.records_of(body)
            nxt = self.next_state(response, body, records, state)
            if nxt is not None and nxt == state:
                # An API answering the same cursor again would be paged forever.
                raise PermanentError(f"paging of {url} does not advance (next page = {nxt!r})")
            last = nxt is None or (self.max_pages is not None and count >= self.max_pages)
            if last:
                tail = nxt if nxt is not None else self.tail_state(response, body, records, state)
                yield Fetched(records, state, None, response, body, tail)
                return
            yield Fetched(records, state, nxt, response, body)
            if last:
                return
            state = nxt

    async def pages(
        self,
        http: httpx.AsyncClient,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        resume: Any = None,
    ) -> AsyncIterator[Page]:
        """:class:`Page` objects whose checkpoint is the state to resume from.

        The last page's checkpoint is its tail (:meth:`tail_state`): with an inclusive
        cursor the page's own state, so the next cycle reads that page again and goes on
        from there if the list has grown; with an exclusive one the state after its last
        record, so the next cycle delivers only what came since.
        """
        async for f in self.fetch(http, url, params=params, headers=headers, resume=resume):
            yield Page(f.records, checkpoint=f.next if f.next is not None else f.tail)


class _ParamCursor(Paginator):
    """A cursor sent back as the query parameter ``param``; the listing ends where the
    body's ``has_more`` (a path, if given) is false."""

    def __init__(
        self, *, records: RecordsAt, param: str, has_more: str | None, max_pages: int | None
    ) -> None:
        super().__init__(records=records, max_pages=max_pages)
        self.param = param
        self.has_more = has_more

    def request(self, url: str, params: dict[str, Any], state: Any) -> tuple[str, dict[str, Any]]:
        if state is not None:
            params[self.param] = state
        return url, params

    def _no_more(self, body: Any) -> bool:
        """The body says this page is the last (``has_more`` false)."""
        return self.has_more is not None and not json_path(body, self.has_more)


class _NextUrl(Paginator):
    """The next page's URL, called as given: query parameters go with the first request
    only (the URL carries its own). It stays on the origin of the page that named it
    unless ``other_origins``."""

    def __init__(self, *, records: RecordsAt, max_pages: int | None, other_origins: bool) -> None:
        super().__init__(records=records, max_pages=max_pages)
        self.other_origins = other_origins

    def request(self, url: str, params: dict[str, Any], state: Any) -> tuple[str, dict[str, Any]]:
        return (url, params) if state is None else (str(state), {})


class CursorPaginator(_ParamCursor):
    """The body names the next page's cursor (``cursor`` path); sent as ``param``.

    No cursor, an empty one, or ``has_more`` (a path) false ends the listing.
    ``exclusive=True`` says the cursor a page names continues *after* its last record
    even on the last page (Zendesk's incremental exports: ``after_cursor`` with
    ``end_of_stream``): :meth:`pages` then resumes a later listing from the last page's
    cursor instead of reading that page again.
    """

    def __init__(
        self,
        *,
        records: RecordsAt = "",
        cursor: str = "next_cursor",
        param: str = "cursor",
        has_more: str | None = None,
        max_pages: int | None = None,
        exclusive: bool = False,
    ) -> None:
        super().__init__(records=records, param=param, has_more=has_more, max_pages=max_pages)
        self.cursor = cursor
        self.exclusive = exclusive

    def tail_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        cursor = json_path(body, self.cursor) if self.exclusive else None
        return cursor if isinstance(cursor, str | int) and cursor != "" else state

    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        if self._no_more(body):
            return None
        cursor = json_path(body, self.cursor)
        if cursor is None or cursor == "":
            return None
        if not isinstance(cursor, str | int):
            raise PermanentError(f"page cursor at {self.cursor!r} is not a string or number")
        return cursor


class IdCursorPaginator(_ParamCursor):
    """The id of a page's last record, sent back as ``param`` (Stripe's ``starting_after``).

    ``has_more`` (a path) false, or an empty page, ends the listing. The cursor is
    *exclusive* (the page after that record), so :meth:`pages` resumes a later listing
    after the last record handed, never re-delivering it: the last page's checkpoint is
    its last record's id (or, for an empty last page, the state that fetched it).

    ``take="first"`` reads the cursor from a page's *first* record instead, for paging
    towards newer objects of a newest-first list with ``param="ending_before"``.
    """

    def __init__(
        self,
        *,
        records: RecordsAt = "data",
        id: str = "id",
        param: str = "starting_after",
        has_more: str | None = "has_more",
        take: Literal["last", "first"] = "last",
        max_pages: int | None = None,
    ) -> None:
        super().__init__(records=records, param=param, has_more=has_more, max_pages=max_pages)
        if take not in ("last", "first"):
            raise ConfigurationError(
                f"IdCursorPaginator take must be 'last' or 'first', not {take!r}"
            )
        self.id = id
        self.take = take

    def cursor_of(self, records: Sequence[Any]) -> str | None:
        """The id of the record the next page starts after (None: an empty page)."""
        if not records:
            return None
        record = records[-1] if self.take == "last" else records[0]
        rid = json_path(record, self.id)
        if isinstance(rid, bool) or not isinstance(rid, str | int) or rid == "":
            raise PermanentError(
                f"record id at {self.id!r} is not a string or number: cannot page after it"
            )
        return str(rid)

    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        return None if self._no_more(body) else self.cursor_of(records)

    def tail_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        cursor = self.cursor_of(records)
        return state if cursor is None else cursor


class NextUrlPaginator(_NextUrl):
    """The body carries the URL of the next page (``next`` path), called as given.

    Query parameters are sent with the first request only: the next URL carries its own.
    ``delta`` is the path of the link the *last* page carries to what changes later
    (Microsoft Graph's ``@odata.deltaLink``): :meth:`pages` then stores it as the last
    page's checkpoint, and the next cycle calls it (an exclusive cursor: only changes
    since). It is origin-checked like a next link.
    """

    def __init__(
        self,
        *,
        records: RecordsAt = "",
        next: str = "next",
        delta: str | None = None,
        max_pages: int | None = None,
        other_origins: bool = False,
    ) -> None:
        super().__init__(records=records, max_pages=max_pages, other_origins=other_origins)
        self.next = next
        self.delta = delta

    def tail_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        if self.delta is None:
            return state
        link = json_path(body, self.delta)
        if link is None or link == "":
            return state
        if not isinstance(link, str):
            raise PermanentError(f"delta link at {self.delta!r} is not a string")
        return _followable(response, link, link, self.other_origins)

    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        nxt = json_path(body, self.next)
        if nxt is None or nxt == "":
            return None
        if not isinstance(nxt, str):
            raise PermanentError(f"next page URL at {self.next!r} is not a string")
        return _followable(response, nxt, nxt, self.other_origins)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme))


def _followable(response: httpx.Response, given: str, target: str, other_origins: bool) -> str:
    """``target`` (the next page, as the request will be made) if it stays on the origin
    of the page that named it; a :class:`PermanentError` otherwise, naming both origins
    and never the URL's query (it may carry a token)."""
    try:
        url = httpx.URL(target)
    except (httpx.InvalidURL, ValueError) as exc:
        raise PermanentError(f"next page URL {given[:100]!r} is not a URL: {exc}") from None
    if other_origins or not url.host:
        return target  # a relative one goes to the client's own base URL
    here = response.request.url
    # A scheme-relative one (//host/path) takes the page's scheme.
    theirs, ours = _origin(here.join(url)), _origin(here)
    if theirs != ours:
        raise PermanentError(
            f"next page URL points to {theirs[0]}://{theirs[1]}:{theirs[2]}, not to "
            f"{ours[0]}://{ours[1]}:{ours[2]} that sent it: not followed, the tenant's "
            "credentials go to no other origin (a paginator takes other_origins=True for "
            "an API that really pages across hosts)"
        )
    return target


class LinkHeaderPaginator(_NextUrl):
    """The ``Link`` header's ``rel="next"`` URL (RFC 8288), called as given."""

    def __init__(
        self,
        *,
        records: RecordsAt = "",
        rel: str = "next",
        max_pages: int | None = None,
        other_origins: bool = False,
    ) -> None:
        super().__init__(records=records, max_pages=max_pages, other_origins=other_origins)
        self.rel = rel

    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        link = response.links.get(self.rel)
        target = link.get("url") if link else None
        if not target:
            return None
        # Relative references resolve against the page that named them.
        return _followable(
            response, target, str(response.request.url.join(target)), self.other_origins
        )


class OffsetPaginator(Paginator):
    """``offset`` and ``limit`` parameters; a short page (or ``total`` reached) is the last."""

    def __init__(
        self,
        *,
        records: RecordsAt = "",
        limit: int = 100,
        offset_param: str = "offset",
        limit_param: str = "limit",
        total: str | None = None,
        max_pages: int | None = None,
    ) -> None:
        super().__init__(records=records, max_pages=max_pages)
        if limit < 1:
            raise ConfigurationError("limit must be at least 1")
        self.limit = limit
        self.offset_param = offset_param
        self.limit_param = limit_param
        self.total = total

    def request(self, url: str, params: dict[str, Any], state: Any) -> tuple[str, dict[str, Any]]:
        params[self.offset_param] = int(state or 0)
        params[self.limit_param] = self.limit
        return url, params

    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        offset = int(state or 0) + len(records)
        if not records:
            return None
        if self.total is not None:
            total = json_path(body, self.total)
            return offset if isinstance(total, int) and offset < total else None
        return offset if len(records) >= self.limit else None


class PageNumberPaginator(Paginator):
    """``page`` (from ``first``) and optionally ``per_page`` parameters.

    An empty page, a page shorter than ``per_page``, or ``total_pages`` reached ends it.
    """

    def __init__(
        self,
        *,
        records: RecordsAt = "",
        param: str = "page",
        first: int = 1,
        per_page: int | None = None,
        per_page_param: str = "per_page",
        total_pages: str | None = None,
        max_pages: int | None = None,
    ) -> None:
        super().__init__(records=records, max_pages=max_pages)
        self.param = param
        self.first = first
        self.per_page = per_page
        self.per_page_param = per_page_param
        self.total_pages = total_pages

    def request(self, url: str, params: dict[str, Any], state: Any) -> tuple[str, dict[str, Any]]:
        params[self.param] = self.first if state is None else int(state)
        if self.per_page is not None:
            params[self.per_page_param] = self.per_page
        return url, params

    def next_state(
        self, response: httpx.Response, body: Any, records: Sequence[Any], state: Any
    ) -> Any:
        page = self.first if state is None else int(state)
        if not records:
            return None
        if self.total_pages is not None:
            total = json_path(body, self.total_pages)
            return page + 1 if isinstance(total, int) and page < total else None
        if self.per_page is not None and len(records) < self.per_page:
            return None
        return page + 1

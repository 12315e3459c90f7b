"""Incremental sync by an ``(updated_at, id)`` watermark, as a small object a connector declares.

Most REST APIs offer "records changed since T", with ``T`` *inclusive*, sorted by update
time. Getting that right is fiddly: records sharing an ``updated_at`` fall on both sides
of a page boundary (and of a cycle boundary), late writers commit a record whose
``updated_at`` is already behind the watermark, and a cursor kept between pages expires
(``410 Gone``). :class:`Incremental` does it once::

    class Tickets(Connector[TicketsConfig]):
        paginator = CursorPaginator(records="tickets", cursor="next_cursor")
        incremental = Incremental("updated_at", since_param="updated_since")

        async def poll(self, ctx, checkpoint):
            async for page in self.incremental.pages(
                ctx.http, "/tickets", self.paginator, checkpoint
            ):
                yield page

What it guarantees, for an API that returns records in ascending ``updated_at`` order
(the order any "since" endpoint is used in) and an inclusive ``since``:

* every version of a record (``id`` at one ``updated_at``) is handed to ``handle()`` once:
  records already seen at the same or a later ``updated_at`` are filtered out, however
  the ties fall across pages, cycles and restarts;
* the query asks for ``since = watermark - lookback``, so a record written late, up to
  ``lookback`` behind the watermark, is still found (and not repeated: the ids seen within
  the lookback window are kept in the checkpoint, so keep ``lookback`` short);
* a stored paging cursor the API no longer knows (``404``/``410``, ``not_found`` to
  synckit) restarts the listing from the watermark instead of from scratch, a few times
  per cycle at most;
* the checkpoint after each page (JSON) holds the watermark, the ids at it and, mid-run,
  the paging state, so a cycle that dies resumes at the page it was on.

A record without a parsable ``updated_at`` or ``id`` is passed on (``handle()`` decides
what it is) but does not move the watermark. Records older than the lookback window are
dropped: with a sorted API they can only be repeats.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import structlog

from synckit.connectors.base import Page
from synckit.connectors.paging import Paginator, json_path
from synckit.errors.classify import ErrorClass
from synckit.errors.exceptions import ConfigurationError, PermanentError

__all__ = ["Incremental", "Watermark", "parse_instant"]

log = structlog.get_logger("synckit.incremental")


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


@dataclass
class Watermark:
    """The state of one stream's incremental sync; :meth:`dump` is its checkpoint.

    ``high`` is the greatest ``(updated_at, id)`` handed on; ``seen`` the ids handed on
    within ``lookback`` of it, with their ``updated_at``; ``resume`` the paging state of a
    listing in progress, and ``since`` the lower bound that listing was asked with.
    """

    lookback: timedelta
    high: tuple[datetime, str] | None = None
    seen: dict[str, datetime] = field(default_factory=dict)
    resume: Any = None
    since: datetime | None = None

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
        return wm

    @property
    def floor(self) -> datetime | None:
        """The lower bound of the next listing: the watermark minus the lookback."""
        return None if self.high is None else self.high[0] - self.lookback

    def take(self, records: Iterable[Any], updated_at: str, id_field: str) -> list[Any]:
        """The records not handed on before, in order; the watermark moves past them."""
        fresh: list[Any] = []
        for record in records:
            at = parse_instant(json_path(record, updated_at))
            raw_id = json_path(record, id_field)
            if at is None or raw_id is None or isinstance(raw_id, dict | list):
                fresh.append(record)  # cannot be placed: handle() decides
                continue
            rid = str(raw_id)
            floor = self.floor
            if floor is not None and at < floor:
                continue
            before = self.seen.get(rid)
            if before is not None and before >= at:
                continue
            fresh.append(record)
            self.seen[rid] = at
            if self.high is None or (at, rid) > self.high:
                self.high = (at, rid)
        self._trim()
        return fresh

    def _trim(self) -> None:
        floor = self.floor
        if floor is not None:
            self.seen = {rid: at for rid, at in self.seen.items() if at >= floor}

    def dump(self) -> dict[str, Any]:
        """The checkpoint: JSON, and :meth:`load` reads it back."""
        return {
            "high": None if self.high is None else [iso_z(self.high[0]), self.high[1]],
            "seen": {rid: iso_z(at) for rid, at in sorted(self.seen.items())},
            "resume": self.resume,
            "since": None if self.since is None else iso_z(self.since),
        }


def _cursor_gone(exc: BaseException) -> bool:
    classification = getattr(exc, "classification", None)
    return getattr(classification, "error_class", None) is ErrorClass.NOT_FOUND


@dataclass(frozen=True)
class Incremental:
    """An ``(updated_at, id)`` watermark over a paginated "changed since" listing.

    ``updated_at`` and ``id`` are dotted paths into a record. ``since_param`` is the query
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

    def __post_init__(self) -> None:
        if not isinstance(self.lookback, timedelta) or self.lookback < timedelta(0):
            raise ConfigurationError("Incremental.lookback must be a non-negative timedelta")
        if self.max_restarts < 0:
            raise ConfigurationError("Incremental.max_restarts must be at least 0")

    def load(self, checkpoint: Any) -> Watermark:
        """The watermark stored in ``checkpoint`` (a fresh one for None)."""
        return Watermark.load(checkpoint, self.lookback)

    def take(self, wm: Watermark, records: Sequence[Any]) -> list[Any]:
        """The records of ``records`` not handed on before; ``wm`` moves past them."""
        return wm.take(records, self.updated_at, self.id)

    async def pages(
        self,
        http: httpx.AsyncClient,
        url: str,
        paginator: Paginator,
        checkpoint: Any,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Page]:
        """The new records of the listing at ``url``, a page at a time, with checkpoints.

        The last page of a listing stores the watermark without paging state, so the
        next cycle asks for ``since = watermark - lookback``.
        """
        wm = self.load(checkpoint)
        restarts = 0
        while True:
            if wm.resume is None:
                wm.since = wm.floor
            query = dict(params or {})
            if self.since_param is not None and wm.since is not None:
                query[self.since_param] = self.since_format(wm.since)
            try:
                async for fetched in paginator.fetch(
                    http, url, params=query, headers=headers, resume=wm.resume
                ):
                    fresh = self.take(wm, fetched.records)
                    wm.resume = fetched.next
                    if wm.resume is None:
                        wm.since = None
                    yield Page(fresh, checkpoint=wm.dump())
                return
            except PermanentError as exc:
                if wm.resume is None or not _cursor_gone(exc) or restarts >= self.max_restarts:
                    raise
                restarts += 1
                log.warning(
                    "incremental.cursor_expired",
                    url=url,
                    restart_from=None if wm.floor is None else iso_z(wm.floor),
                    error=str(exc)[:200],
                )
                wm.resume = None

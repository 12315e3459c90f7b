"""A Stripe-like list endpoint for :class:`~synckit.testing.fakeapi.FakeAPI`: newest first,
paged by object id.

:class:`NewestFirstList` holds objects (``id``, ``created``, and any fields given) and
answers ``GET`` requests as Stripe's list endpoints do::

    api = FakeAPI()
    customers = NewestFirstList("cus")
    customers.add(250)
    customers.mount(api, "/v1/customers")
    with api.serve_in_thread() as url:
        ...  # GET {url}/v1/customers?limit=100&starting_after=cus_000150

* ``limit`` (default 10, at most 100) objects a page, newest ``created`` first (ties: the
  later-added first), in ``{"object": "list", "data": [...], "has_more": bool}``;
* ``starting_after=ID``: the page of objects just older than ``ID``; ``ending_before=ID``:
  the page of objects just newer than ``ID`` (still newest first), ``has_more`` telling
  whether more newer ones remain;
* an ``ID`` the list does not hold (never did, or :meth:`NewestFirstList.expire` dropped
  it, as Stripe drops events after 30 days) is answered ``404`` with Stripe's error body
  (``resource_missing``).

``disorder=True`` serves each page's objects out of order (two swapped), for testing that
a client notices.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from synckit.testing.fakeapi import FakeAPI
from synckit.testing.replies import RecordedRequest, Reply

__all__ = ["NewestFirstList"]


class NewestFirstList:
    """Objects listed newest first with ``starting_after`` / ``ending_before`` id cursors.

    ``start`` is the ``created`` (epoch seconds) of the first object added; each object
    added after it is ``per_second`` objects to a second later (so objects share
    ``created`` values when ``per_second`` > 1: ties).
    """

    def __init__(
        self,
        prefix: str = "obj",
        *,
        start: int = 1_700_000_000,
        per_second: int = 1,
        default_limit: int = 10,
        max_limit: int = 100,
        disorder: bool = False,
    ) -> None:
        if per_second < 1 or default_limit < 1 or max_limit < default_limit:
            raise ValueError("per_second and default_limit must be >= 1, max_limit >= them")
        self.prefix = prefix
        self.start = start
        self.per_second = per_second
        self.default_limit = default_limit
        self.max_limit = max_limit
        self.disorder = disorder
        self.lock = threading.RLock()
        #: Newest first.
        self.objects: list[dict[str, Any]] = []
        self._added = 0

    def add(self, n: int = 1, **fields: Any) -> list[dict[str, Any]]:
        """Add ``n`` objects at the top of the list (each newer than every one before);
        return them, oldest first."""
        made = []
        with self.lock:
            for _ in range(n):
                seq = self._added
                self._added += 1
                obj = {
                    "id": f"{self.prefix}_{seq:08d}",
                    "object": self.prefix,
                    "created": self.start + seq // self.per_second,
                    **fields,
                }
                self.objects.insert(0, obj)
                made.append(obj)
        return made

    def expire(self, keep: int) -> list[str]:
        """Drop all but the ``keep`` newest objects (a retention window); their ids."""
        with self.lock:
            dropped = [o["id"] for o in self.objects[keep:]]
            del self.objects[keep:]
        return dropped

    def ids(self) -> list[str]:
        """Every id held, newest first."""
        with self.lock:
            return [o["id"] for o in self.objects]

    def mount(self, api: FakeAPI, path: str) -> None:
        """Answer ``GET path`` on ``api`` from this list."""
        api.route("GET", path, self.handle)

    def handle(self, request: RecordedRequest) -> Reply:
        return self.answer(request.query, request.path)

    def answer(self, query: Mapping[str, str], path: str = "/") -> Reply:
        """The reply to a list request with ``query``."""
        try:
            limit = int(query.get("limit", self.default_limit))
        except ValueError:
            return _invalid("limit", f"Invalid integer: {query.get('limit')!r}")
        if not 1 <= limit <= self.max_limit:
            return _invalid("limit", f"limit must be between 1 and {self.max_limit}")
        after, before = query.get("starting_after"), query.get("ending_before")
        if after is not None and before is not None:
            return _invalid("ending_before", "Pass starting_after or ending_before, not both")
        with self.lock:
            objs = self.objects
            if after is None and before is None:
                page, more = objs[:limit], len(objs) > limit
            else:
                cursor = after if after is not None else before
                index = next((i for i, o in enumerate(objs) if o["id"] == cursor), None)
                if index is None:
                    return Reply.json(
                        {
                            "error": {
                                "type": "invalid_request_error",
                                "code": "resource_missing",
                                "param": "starting_after" if after is not None else "ending_before",
                                "message": f"No such {self.prefix}: '{cursor}'",
                            }
                        },
                        404,
                    )
                if after is not None:
                    page = objs[index + 1 : index + 1 + limit]
                    more = index + 1 + limit < len(objs)
                else:
                    page = objs[max(0, index - limit) : index]
                    more = index - limit > 0
            data = [dict(o) for o in page]
        if self.disorder and len(data) >= 3:
            data[0], data[1] = data[1], data[0]
        return Reply.json({"object": "list", "url": path, "data": data, "has_more": more})


def _invalid(param: str, message: str) -> Reply:
    return Reply.json(
        {"error": {"type": "invalid_request_error", "param": param, "message": message}}, 400
    )

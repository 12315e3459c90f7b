"""The console's lists: their previous and next links, and the job kinds they hide.

Pages are keyset pages (:mod:`synckit.store.pages`): a cursor leads forward, never back.
The way back is the trail of cursors this browser followed, carried in the link itself
(``back``, the last :data:`TRAIL` of them): "previous" drops the newest, and a trail cut
short leads back to the first page. No store query runs backwards, so every list gets
both links alike, whatever index serves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlencode

__all__ = ["INTERNAL_KINDS", "TRAIL", "page_links"]

#: How many cursors a link carries back.
TRAIL = 30
#: The runtime's housekeeping jobs: hidden in the job list unless asked for (they run
#: every few seconds and would push the application's jobs off the page). Poll cycles,
#: writes and webhook processing are the application's work and stay shown.
INTERNAL_KINDS = (
    "synckit.schedule",
    "synckit.dlq_replay",
    "synckit.alerts",
    "synckit.webhooks.sweep",
)


def page_links(
    params: Sequence[tuple[str, str]], name: str, next_cursor: str | None
) -> tuple[str | None, str | None]:
    """The query strings of the next and previous pages of a list whose cursor is the
    parameter ``name`` (None where there is no such page); ``params`` are the page's
    own, as pairs (``back`` repeats: one per cursor, empty for the first page)."""
    kept = [(k, v) for k, v in params if k not in (name, "back") and v]
    here = next((v for k, v in params if k == name), "")
    trail = [v for k, v in params if k == "back"]
    nxt = None
    if next_cursor is not None:
        forward = [*trail, here][-TRAIL:]
        nxt = urlencode([*kept, (name, next_cursor), *(("back", c) for c in forward)])
    prev = None
    if here:
        before = trail[-1] if trail else ""  # a trail cut short leads to the first page
        cursor = [(name, before)] if before else []
        prev = urlencode([*kept, *cursor, *(("back", c) for c in trail[:-1])])
    return nxt, prev

"""State a process keeps per event loop: a lock, a shared view, held only while in use.

It is keyed by the loop itself, never by its ``id()``: a new loop may get a dead one's
id, and asyncio objects (a lock, a future) belong to the loop that made them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable
from typing import TypeVar

__all__ = ["PerLoop", "per_loop"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Each loop's values by key, each kept while something holds it, gone with its loop.
PerLoop = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakValueDictionary[K, V]]


def per_loop(registry: PerLoop[K, V], key: K, make: Callable[[], V]) -> V:
    """The running loop's value for ``key`` in ``registry``, made by ``make`` if it has
    none (or none still held)."""
    values = registry.setdefault(asyncio.get_running_loop(), weakref.WeakValueDictionary())
    found = values.get(key)
    if found is None:
        found = make()
        values[key] = found
    return found

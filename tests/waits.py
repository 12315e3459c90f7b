"""Waiting for events in tests, never for the clock.

A test waits for what it is about (a row's state, a log line, a handler's mark) and
moves on the moment it happens. The timeout only turns a wait that would never end
into a failure: it is long enough that reaching it means a bug, however busy the
machine (two cores shared with other work can make a process start in 15 s). A
wall-clock bound is asserted only where time is the behaviour under test (pacing, a
``Retry-After`` honoured), as a lower bound or from a named, generous budget.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Reaching it means the event never came: a bug, not a slow machine.
EVENT_TIMEOUT = 120.0
# A CLI command run to completion (subprocess.run's timeout), or a process asked to stop.
PROCESS_TIMEOUT = EVENT_TIMEOUT


def wait_until(
    check: Callable[[], T],
    what: str | Callable[[], str],
    timeout: float = EVENT_TIMEOUT,
    interval: float = 0.1,
) -> T:
    """``check()``'s first truthy value; fails naming ``what`` (a text, or a function
    giving one, e.g. a log's tail) if none comes within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {_text(what)}")
        time.sleep(interval)


async def await_until(
    check: Callable[[], Awaitable[T]],
    what: str | Callable[[], str],
    timeout: float = EVENT_TIMEOUT,  # noqa: ASYNC109 -- the wait's bound, named in its failure
    interval: float = 0.05,
) -> T:
    """As ``wait_until``, for an async ``check``; the event loop runs meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {_text(what)}")
        await asyncio.sleep(interval)


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> int:
    """Terminate ``proc`` and reap it (killed if it ignores the signal): its exit code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def _text(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()
